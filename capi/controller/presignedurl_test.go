package controller_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const annotationPresignedURLExpiry = "bootstrap.gatehouse.dev/presigned-url-expiry"

// presignedURLTTL is the tests' spec.userDataStore.presignedURLTTL.
const presignedURLTTL = time.Hour

// bucketSpec is a spec keeping the data in s3's bucket behind a presigned
// URL valid for presignedURLTTL; its credentials are in the Secret "s3"
// (bucketCredentials).
func bucketSpec(s3 *testenv.MinIO, format bootstrapv1.Format, attested bool) bootstrapv1.KubeadmConfigSpec {
	spec := bootstrapv1.KubeadmConfigSpec{Format: format, UserDataStore: &bootstrapv1.UserDataStore{
		Endpoint: s3.Endpoint, Bucket: s3.Bucket, CredentialsSecret: "s3", Stub: "presigned-url",
		PresignedURLTTL: &metav1.Duration{Duration: presignedURLTTL}}}
	if attested {
		spec.Attested = &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}
	}
	return spec
}

// bucketCredentials creates the Secret "s3" of bucketSpec in ns.
func bucketCredentials(t *testing.T, e *env, ns string, s3 *testenv.MinIO) *corev1.Secret {
	t.Helper()
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{
		"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey), "ca.crt": s3.CACertPEM}}
	if err := e.Client.Create(t.Context(), creds); err != nil {
		t.Fatal(err)
	}
	return creds
}

// stubURL is the presigned URL in a data Secret's stub (cloud-config's
// #include or Ignition's replace source).
func stubURL(t *testing.T, s *corev1.Secret) string {
	t.Helper()
	u := regexp.MustCompile(`https://[^\s"]+`).FindString(string(s.Data["value"]))
	if u == "" {
		t.Fatalf("no presigned HTTPS URL in the stub:\n%s", s.Data["value"])
	}
	return strings.ReplaceAll(u, `\u0026`, "&")
}

// presignLog numbers the presigned URLs the controller makes and records
// when, by its fake clock, each was made. MinIO signs with the real clock,
// so two URLs of one object and TTL made within the same real second are
// the same string, whatever the fake clock says: each URL gets its number
// as a fragment ("#presign-<n>", never sent to the server) so the test
// knows which presign made the URL in a stub, and so when, per the fake
// clock, it expires.
type presignLog struct {
	clock *clocktesting.FakePassiveClock
	mu    sync.Mutex
	at    []time.Time
}

// stores is the reconciler's StoreFactory: the real bucket (userdatastore),
// with its presigned URLs numbered.
func (l *presignLog) stores(cfg userdatastore.Config) (controller.ObjectStore, error) {
	s, err := userdatastore.New(cfg)
	if err != nil {
		return nil, err
	}
	return numberedStore{Store: s, log: l}, nil
}

type numberedStore struct {
	*userdatastore.Store
	log *presignLog
}

func (s numberedStore) PresignedGetURL(ctx context.Context, key string, ttl time.Duration) (*url.URL, error) {
	u, err := s.Store.PresignedGetURL(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	u.Fragment = "presign-" + strconv.Itoa(len(s.log.at))
	s.log.at = append(s.log.at, s.log.clock.Now())
	return u, nil
}

// madeAt is when (since start, by the fake clock) the URL u was made; it
// also checks that u is valid for presignedURLTTL.
func (l *presignLog) madeAt(t *testing.T, start time.Time, u string) time.Duration {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Query().Get("X-Amz-Expires"); got != strconv.Itoa(int(presignedURLTTL.Seconds())) {
		t.Fatalf("the URL is valid for %ss, want %v", got, presignedURLTTL)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(p.Fragment, "presign-"))
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || n < 0 || n >= len(l.at) {
		t.Fatalf("the stub's URL was not made by the controller's store: fragment %q", p.Fragment)
	}
	return l.at[n].Sub(start)
}

// withPresignLog gives the fixture a reconciler whose presigned URLs are
// numbered (presignLog).
func (f *poolFixture) withPresignLog() *presignLog {
	l := &presignLog{clock: f.clock}
	f.r = f.e.reconciler(controller.Config{Clock: f.clock, TokenTTL: f.ttl, Stores: l.stores})
	return l
}

// poolToken is the pool's one bootstrap token Secret (its data is in the
// bucket), and its expiration.
func (f *poolFixture) poolToken(t *testing.T) (*corev1.Secret, time.Time) {
	t.Helper()
	names := f.e.configTokens(t, f.cfg)
	if len(names) != 1 {
		t.Fatalf("the pool has tokens %v, want one", names)
	}
	s := &corev1.Secret{}
	if err := f.e.Client.Get(t.Context(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: names[0]}, s); err != nil {
		t.Fatal(err)
	}
	return s, expirationOf(t, s)
}

// TestPresignedURLRenewal runs the presigned URL renewal's tests against
// one real MinIO (TLS, SSE-S3).
func TestPresignedURLRenewal(t *testing.T) {
	s3 := testenv.StartMinIO(t, testenv.MinIOOptions{SSE: true, Bucket: "bootstrap-data"})
	t.Run("pool", func(t *testing.T) { testMachinePoolPresignedURLRenewed(t, s3) })
	t.Run("credentials-gone", func(t *testing.T) { testMachinePoolPresignedURLCredentialsGone(t, s3) })
	t.Run("machine", func(t *testing.T) { testMachinePresignedURLKept(t, s3) })
}

// testMachinePoolPresignedURLRenewed: a MachinePool's data in a bucket
// stays fetchable for the pool's whole lifetime. Over four URL TTLs of the
// fake clock, reconciling whenever the controller asks to be requeued, the
// presigned URL in the pool's data Secret is replaced by a new one once
// less than half its TTL is left, never later: the URL the Secret holds
// never has less than half its TTL left, so one expired per the fake clock
// is never in it. Each new URL GETs the same object from MinIO (nothing
// rendered again): for a pool that keeps scaling, whose token is extended
// and never rotated, and for an attested pool, which has no token.
func testMachinePoolPresignedURLRenewed(t *testing.T, s3 *testenv.MinIO) {
	tests := []struct {
		name     string
		format   bootstrapv1.Format
		attested bool
	}{
		{"scaling-cloud-config", bootstrapv1.FormatCloudConfig, false},
		{"scaling-ignition", bootstrapv1.FormatIgnition, false},
		{"attested-cloud-config", bootstrapv1.FormatCloudConfig, true},
		{"attested-ignition", bootstrapv1.FormatIgnition, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newPoolFixture(t, 3, bucketSpec(s3, tc.format, tc.attested))
			presigns := f.withPresignLog()
			bucketCredentials(t, f.e, f.cfg.Namespace, s3)
			f.joined(t, 1) // one of three: the pool keeps scaling
			res := f.reconcile(t, 0)
			cur := stubURL(t, f.dataSecret(t))
			status, object := fetch(t, s3.RootCAs, cur)
			if status != http.StatusOK {
				t.Fatalf("GET of the first URL: %d %s", status, object)
			}
			var token *corev1.Secret
			if !tc.attested {
				token, _ = f.poolToken(t)
			}
			writtenAt := presigns.madeAt(t, f.start, cur)
			renewals := 0
			for at := time.Duration(0); at < 4*presignedURLTTL; {
				due := writtenAt + presignedURLTTL/2
				if res.RequeueAfter <= 0 || at+res.RequeueAfter > due {
					t.Fatalf("at %v: requeued after %v, but the URL made at %v needs renewing at %v (it expires at %v)",
						at, res.RequeueAfter, writtenAt, due, writtenAt+presignedURLTTL)
				}
				at += res.RequeueAfter
				res = f.reconcile(t, at)
				if readyReason(f.cfg) != controller.ReasonDataSecretAvailable {
					t.Fatalf("at %v: conditions %+v", at, f.cfg.Status.Conditions)
				}
				u := stubURL(t, f.dataSecret(t))
				made := presigns.madeAt(t, f.start, u)
				if made == writtenAt {
					if at >= due {
						t.Fatalf("at %v the URL made at %v, with %v left, was not renewed", at, writtenAt, writtenAt+presignedURLTTL-at)
					}
					continue
				}
				if at < due || made != at {
					t.Fatalf("at %v the URL made at %v was replaced by one made at %v; it was due at %v", at, writtenAt, made, due)
				}
				renewals++
				if status, body := fetch(t, s3.RootCAs, u); status != http.StatusOK || !bytes.Equal(body, object) {
					t.Fatalf("at %v the new URL GETs %d, the object as first written: %v", at, status, bytes.Equal(body, object))
				}
				writtenAt = made
				want := f.start.Add(at + presignedURLTTL).UTC().Format(time.RFC3339)
				if got := f.cfg.Annotations[annotationPresignedURLExpiry]; got != want {
					t.Fatalf("at %v the URL's recorded expiry is %q, want %q", at, got, want)
				}
			}
			if renewals < 7 {
				t.Fatalf("%d renewals over %v of %v URLs", renewals, 4*presignedURLTTL, presignedURLTTL)
			}
			if tc.attested {
				if tokens := f.e.configTokens(t, f.cfg); len(tokens) > 0 {
					t.Fatalf("the attested pool has tokens %v", tokens)
				}
				return
			}
			// The token was extended all along, never replaced.
			tok, exp := f.poolToken(t)
			if tok.Name != token.Name || f.cfg.Annotations[annotationTokenRotation] != "" || !exp.After(f.clock.Now()) {
				t.Fatalf("the data's token %s (was %s) expiring %v, rotation %q", tok.Name, token.Name, exp, f.cfg.Annotations[annotationTokenRotation])
			}
		})
	}
}

// testMachinePoolPresignedURLCredentialsGone: a renewal that cannot reach
// the bucket (its credentials Secret is gone) leaves the data Secret as it
// is, reports UserDataStoreFailed and retries; once the credentials are
// back the URL is renewed.
func testMachinePoolPresignedURLCredentialsGone(t *testing.T, s3 *testenv.MinIO) {
	f := newPoolFixture(t, 2, bucketSpec(s3, bootstrapv1.FormatCloudConfig, true))
	presigns := f.withPresignLog()
	creds := bucketCredentials(t, f.e, f.cfg.Namespace, s3)
	f.reconcile(t, 0)
	before := f.dataSecret(t)
	if err := f.e.Client.Delete(t.Context(), creds); err != nil {
		t.Fatal(err)
	}

	res := f.reconcile(t, presignedURLTTL/2)
	if c := condition(f.cfg, controller.ConditionDataSecretAvailable); c == nil || c.Reason != controller.ReasonUserDataStoreFailed {
		t.Fatalf("condition %+v, want %s", c, controller.ReasonUserDataStoreFailed)
	}
	if res.RequeueAfter != 20*time.Second {
		t.Fatalf("requeue after %v, want 20s", res.RequeueAfter)
	}
	if f.dataSecret(t).ResourceVersion != before.ResourceVersion {
		t.Fatal("the data Secret was rewritten without a new URL")
	}

	bucketCredentials(t, f.e, f.cfg.Namespace, s3)
	res = f.reconcile(t, presignedURLTTL/2+20*time.Second)
	if readyReason(f.cfg) != controller.ReasonDataSecretAvailable {
		t.Fatalf("conditions %+v", f.cfg.Status.Conditions)
	}
	u := stubURL(t, f.dataSecret(t))
	if made := presigns.madeAt(t, f.start, u); made != presignedURLTTL/2+20*time.Second {
		t.Fatalf("the stub's URL was made at %v: not renewed once the credentials were back", made)
	}
	if status, body := fetch(t, s3.RootCAs, u); status != http.StatusOK {
		t.Fatalf("GET of the new URL: %d %s", status, body)
	}
	if res.RequeueAfter != presignedURLTTL/2 {
		t.Fatalf("requeue after %v, want %v", res.RequeueAfter, presignedURLTTL/2)
	}
}

// testMachinePresignedURLKept: a Machine boots once, from the URL it was
// given: its config's data Secret is never rewritten, however long it
// waits, and records no URL expiry.
func testMachinePresignedURLKept(t *testing.T, s3 *testenv.MinIO) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	bucketCredentials(t, e, ns, s3)
	start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakePassiveClock(start)
	r := e.reconciler(controller.Config{Clock: clock, TokenTTL: 15 * time.Minute})
	_, cfg, err := e.Machine(t.Context(), cluster, "worker-0", false, bucketSpec(s3, bootstrapv1.FormatCloudConfig, false))
	if err != nil {
		t.Fatal(err)
	}
	dataSecret := func() *corev1.Secret {
		t.Helper()
		s := &corev1.Secret{}
		if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: cfg.Name}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg)}
	var before *corev1.Secret
	for at := time.Duration(0); at < 3*presignedURLTTL; {
		clock.SetTime(start.Add(at))
		res, err := r.Reconcile(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if before == nil {
			before = dataSecret()
		} else if dataSecret().ResourceVersion != before.ResourceVersion {
			t.Fatalf("at %v the Machine's data Secret was rewritten", at)
		}
		if res.RequeueAfter <= 0 {
			t.Fatalf("at %v: no requeue (the token is refreshed until the node joins)", at)
		}
		at += res.RequeueAfter
	}
	if err := e.Client.Get(t.Context(), req.NamespacedName, cfg); err != nil {
		t.Fatal(err)
	}
	if readyReason(cfg) != controller.ReasonDataSecretAvailable {
		t.Fatalf("conditions %+v", cfg.Status.Conditions)
	}
	if _, ok := cfg.Annotations[annotationPresignedURLExpiry]; ok {
		t.Fatalf("a Machine's config records a URL expiry: %v", cfg.Annotations)
	}
}
