package joinservice

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// clockClient returns a client of a fresh API server (no controllers, so
// nothing but the code under test touches tokens and Leases) and a fake
// clock at a whole second.
func clockClient(t *testing.T) (kubernetes.Interface, *testingclock.FakeClock) {
	t.Helper()
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return client, testingclock.NewFakeClock(time.Now().Truncate(time.Second))
}

// TestTokenReuseAndRenewal walks one join request's token through its life
// on a fake clock: reused while at least tokenReuseMargin is left, renewed
// in place (same id, same Secret, new secret part and expiration) after.
func TestTokenReuseAndRenewal(t *testing.T) {
	client, clock := clockClient(t)
	tokens := NewTokens(client, clock.Now)
	ctx := t.Context()
	const key = "identity\x00node-a"

	first, err := tokens.Issue(ctx, key, "", "first")
	if err != nil {
		t.Fatal(err)
	}
	if want := clock.Now().Add(tokenTTL); !first.Expiration.Equal(want) {
		t.Fatalf("expiration %s, want %s", first.Expiration, want)
	}

	clock.Step(tokenTTL - tokenReuseMargin) // exactly the margin left: reused
	again, err := tokens.Issue(ctx, key, "", "again")
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Fatalf("with %s left the token was not reused: %s, want %s", tokenReuseMargin, again.ID, first.ID)
	}

	clock.Step(time.Second) // less than the margin left: renewed
	renewed, err := tokens.Issue(ctx, key, "", "renewed")
	if err != nil {
		t.Fatal(err)
	}
	if renewed.ID != first.ID || renewed.Secret == first.Secret {
		t.Fatalf("renewal must keep the id and change the secret: got %s, first %s", renewed.ID, first.ID)
	}
	if want := clock.Now().Add(tokenTTL); !renewed.Expiration.Equal(want) {
		t.Fatalf("renewed expiration %s, want %s", renewed.Expiration, want)
	}
	list, err := client.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: labelJoinRequest + "=" + requestTokens.OwnerLabel(key),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d token Secrets for one join request, want 1", len(list.Items))
	}
	stored, ok := bootstraptoken.FromSecret(&list.Items[0])
	if !ok || stored != renewed {
		t.Fatalf("the stored token is not the renewed one (parsed %v)", ok)
	}
	if got := string(list.Items[0].Data["description"]); got != "renewed" {
		t.Fatalf("description %q, want the renewal's", got)
	}
}

// TestTokenIDTakenByAnotherRequest: a Secret with the request's token id
// but another request's label is never handed out or overwritten.
func TestTokenIDTakenByAnotherRequest(t *testing.T) {
	client, clock := clockClient(t)
	const key = "identity\x00node-b"
	foreign, err := bootstraptoken.New(requestTokens.ID(key), clock.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	s := bootstraptoken.Secret(foreign, map[string]string{labelJoinRequest: "someone-else"}, "made by kubeadm token create")
	if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewTokens(client, clock.Now).Issue(t.Context(), key, "", "x"); !errors.Is(err, bootstraptoken.ErrIDTaken) {
		t.Fatalf("Issue over a foreign token: %v, want ErrIDTaken", err)
	}
	got, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Get(t.Context(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := bootstraptoken.FromSecret(got); tok != foreign {
		t.Fatal("the foreign token Secret was changed")
	}
}

// TestControlPlaneLockDeadline: a holder that never joins keeps the lock
// exactly until its deadline; only the same node with the same identity
// resumes it; a release frees it at once.
func TestControlPlaneLockDeadline(t *testing.T) {
	client, clock := clockClient(t)
	lock := NewControlPlaneLock(client, testNamespace, ControlPlaneJoinTimeout, clock.Now)
	ctx := t.Context()
	start := clock.Now()

	if _, err := lock.Acquire(ctx, "cp-1", "id-1"); err != nil {
		t.Fatal(err)
	}
	var busy *busyError
	if _, err := lock.Acquire(ctx, "cp-1", "id-other"); !errors.As(err, &busy) || busy.Holder != "cp-1" {
		t.Fatalf("the holder's name with another identity: %v, want busy", err)
	}
	if _, err := lock.Acquire(ctx, "cp-1", "id-1"); err != nil {
		t.Fatalf("the holder resuming: %v", err)
	}
	clock.Step(ControlPlaneJoinTimeout - time.Second)
	_, err := lock.Acquire(ctx, "cp-2", "id-2")
	if !errors.As(err, &busy) || busy.Holder != "cp-1" || !busy.Until.Equal(start.Add(ControlPlaneJoinTimeout)) {
		t.Fatalf("one second before the deadline: %v, want busy with cp-1 until %s", err, start.Add(ControlPlaneJoinTimeout))
	}

	clock.Step(time.Second) // the deadline: cp-1 never joined, the lock is free
	release, err := lock.Acquire(ctx, "cp-2", "id-2")
	if err != nil {
		t.Fatalf("at the deadline: %v", err)
	}
	assertHolder(t, client, "cp-2")
	if _, err := lock.Acquire(ctx, "cp-3", "id-3"); !errors.As(err, &busy) || busy.Holder != "cp-2" {
		t.Fatalf("cp-3 while cp-2 holds: %v", err)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	assertHolder(t, client, "")
	if _, err := lock.Acquire(ctx, "cp-3", "id-3"); err != nil {
		t.Fatalf("after release: %v", err)
	}
	assertHolder(t, client, "cp-3")
}

func assertHolder(t *testing.T, client kubernetes.Interface, want string) {
	t.Helper()
	lease, err := client.CoordinationV1().Leases(testNamespace).Get(t.Context(), ControlPlaneLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != want {
		t.Fatalf("Lease holder %q, want %q", got, want)
	}
}
