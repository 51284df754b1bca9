package controller_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

// bulkyFiles are n files of size incompressible bytes each.
func bulkyFiles(n, size int) []cabpkv1.File {
	rng := rand.New(rand.NewPCG(1, 2))
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	files := make([]cabpkv1.File, n)
	for i := range files {
		b := make([]byte, size)
		for j := range b {
			b[j] = letters[rng.IntN(len(letters))]
		}
		files[i] = cabpkv1.File{Path: fmt.Sprintf("/opt/bulk/%d", i), Content: string(b)}
	}
	return files
}

var sizeMessage = regexp.MustCompile(`the bootstrap data is (\d+) bytes raw, over (?:the user-data limit of|the) (\d+) bytes`)

// TestUserDataTooLarge: data over the user-data limit (16 KiB raw unless
// spec.maxUserDataSize says more) or over what a Secret holds gets the
// UserDataTooLarge condition naming the size, the limit and the fix, is
// not retried, and leaves no token or finalizer; a raised limit lets it
// through.
func TestUserDataTooLarge(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	r := e.reconciler(controller.Config{})
	tooLarge := func(t *testing.T, cfg *bootstrapv1.KubeadmConfig, wantLimit int) {
		t.Helper()
		for range 2 {
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg)})
			if err != nil || !res.IsZero() {
				t.Fatalf("Reconcile: %+v, %v; want no error and no retry", res, err)
			}
		}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
			t.Fatal(err)
		}
		c := condition(cfg, controller.ConditionDataSecretAvailable)
		if c == nil || c.Reason != controller.ReasonUserDataTooLarge || cfg.Status.DataSecretName != nil {
			t.Fatalf("condition %+v, data %v", c, cfg.Status.DataSecretName)
		}
		m := sizeMessage.FindStringSubmatch(c.Message)
		if m == nil || !strings.Contains(c.Message, "userDataStore") || !strings.Contains(c.Message, "gzip") {
			t.Fatalf("the message does not name the size, the limit and the fix: %s", c.Message)
		}
		if size, _ := strconv.Atoi(m[1]); size <= wantLimit || m[2] != strconv.Itoa(wantLimit) {
			t.Fatalf("size %s and limit %s in %q, want a size over %d", m[1], m[2], c.Message, wantLimit)
		}
		if slices.Contains(cfg.Finalizers, controller.Finalizer) || len(e.configTokens(t, cfg)) > 0 {
			t.Fatalf("data too large left finalizers %v, tokens %v", cfg.Finalizers, e.configTokens(t, cfg))
		}
	}

	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		t.Run(string(format), func(t *testing.T) {
			_, cfg, err := e.Machine(ctx, cluster, "worker-"+string(format), false,
				bootstrapv1.KubeadmConfigSpec{Format: format, Files: bulkyFiles(3, 8000)})
			if err != nil {
				t.Fatal(err)
			}
			tooLarge(t, cfg, controller.DefaultMaxUserDataSize)

			cfg.Spec.MaxUserDataSize = resource.NewQuantity(64<<10, resource.BinarySI)
			if err := e.Client.Update(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			if err := e.reconcileOnce(t, r, cfg); err != nil {
				t.Fatal(err)
			}
			if n := len(e.data(t, cfg)); n <= controller.DefaultMaxUserDataSize || n > 64<<10 {
				t.Fatalf("%d bytes of data under a 64 KiB limit", n)
			}
		})
	}

	t.Run("over a Secret", func(t *testing.T) {
		_, cfg, err := e.Machine(ctx, cluster, "worker-huge", false, bootstrapv1.KubeadmConfigSpec{
			Format: bootstrapv1.FormatCloudConfig, Files: bulkyFiles(105, 10240),
			MaxUserDataSize: resource.NewQuantity(4<<20, resource.BinarySI)})
		if err != nil {
			t.Fatal(err)
		}
		tooLarge(t, cfg, 1<<20-len(bootstrapv1.FormatCloudConfig))
	})
}
