//go:build vmnodes

package vme2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// software is a node image version: its directory (as mini's qemu
// provider reads it) with its signed reference values and their key.
type software struct {
	dir, values, key string
}

// nextSoftware is the next version of image's node software: the
// worker's UKI with one character of its kernel command line changed
// (different PCRs 4, 11 and 12, as any new kernel, initrd or command line
// gives), its reference values predicted from its UKIs and signed with a
// new vendor key, as a release of the image would ship them.
func nextSoftware(t *testing.T, bin string, image testenv.NodeImage) software {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "image-v2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(image.ControlPlaneDisk, filepath.Join(dir, "node-controlplane.raw")); err != nil {
		t.Fatal(err)
	}
	workerUKI := clustertest.ChangedCommandLine(t, image.WorkerUKI, image.WorkerDisk, filepath.Join(dir, "node-worker.raw"))
	data, err := os.ReadFile(filepath.Join(image.Dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		Root struct {
			Verity struct {
				RootHash string `json:"rootHash"`
			} `json:"verity"`
		} `json:"root"`
	}
	if err := json.Unmarshal(data, &manifest); err != nil {
		t.Fatal(err)
	}
	sw := software{dir: dir, values: filepath.Join(dir, "reference-values.signed.json"), key: filepath.Join(dir, "signing-key.pub")}
	priv := filepath.Join(t.TempDir(), "values-signing.key")
	for _, args := range [][]string{
		{"image", "keygen", "--private-key", priv, "--public-key", sw.key},
		{"image", "predict", "--control-plane-uki", image.ControlPlaneUKI, "--worker-uki", workerUKI,
			"--manifest", filepath.Join(image.Dir, "manifest.json"), "--root-hash", manifest.Root.Verity.RootHash,
			"--image-version", "v2-test", "--output", filepath.Join(dir, "reference-values.json"), "--key", priv, "--signed-output", sw.values},
	} {
		if out, err := clustertest.Gatehouse(t, bin, args...); err != nil {
			t.Fatalf("gatehouse %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return sw
}

// upgradeNodeValues runs `gatehouse upgrade apply --node-values` on the
// cluster in dir and returns its output.
func upgradeNodeValues(t *testing.T, bin, dir string, sw software) string {
	t.Helper()
	start := time.Now()
	out, err := clustertest.Gatehouse(t, bin, "upgrade", "apply", "--kubeconfig", filepath.Join(dir, "gatehouse-admin.conf"),
		"--node-values", sw.values, "--node-values-key", sw.key, "--state-file", filepath.Join(dir, "gatehouse-state.json"),
		"--backup-dir", t.TempDir())
	if err != nil {
		t.Fatalf("upgrade apply --node-values: %v\n%s", err, out)
	}
	t.Logf("MEASURED: upgrade apply --node-values took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	return out
}

// moveNodeSoftware moves VM worker name of the cluster in dir to the next
// node software: the join policy accepts its values while the worker
// still runs the old software (which stays accepted: the command names
// the worker as the reason); the worker restarted on the new software
// rejoins and stays Verified, never tainted; the next run retires the old
// values; the worker restarted on the old software is then tainted, and
// its rejoin refused naming the .cmdline event.
func moveNodeSoftware(ctx context.Context, t *testing.T, client kubernetes.Interface, bin, dir, name string, image testenv.NodeImage) {
	t.Helper()
	sw := nextSoftware(t, bin, image)
	out := upgradeNodeValues(t, bin, dir, sw)
	if !strings.Contains(out, "The join policy accepts the reference values of gatehouse-node v2-test") ||
		!regexp.MustCompile(`Kept roles\.worker\.\S+ \S+: `+name+` still prove it`).MatchString(out) {
		t.Fatalf("the first run should accept v2 and keep the values %s still proves; it said:\n%s", name, out)
	}
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)

	restarted := time.Now()
	if err := mini.RestartVMNode(ctx, dir, name, sw.dir); err != nil {
		t.Fatal(err)
	}
	waitStateOpened(ctx, t, dir, name, 3)
	waitReady(ctx, t, client, dir, name, restarted)
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)
	assertNotTainted(ctx, t, client, name)

	// The retirement fetches fresh evidence from every node: it verifies
	// only when the worker proves v2.
	out = upgradeNodeValues(t, bin, dir, sw)
	assertNotTainted(ctx, t, client, name)
	if !regexp.MustCompile(`Retiring what no node of \d+ proves anymore:\n  roles\.worker\.`).MatchString(out) {
		t.Fatalf("the second run should retire the worker's old values; it said:\n%s", out)
	}

	// The old software is now anything else.
	if err := mini.RestartVMNode(ctx, dir, name, image.Dir); err != nil {
		t.Fatal(err)
	}
	waitTainted(ctx, t, client, name)
	refusal := waitLog(ctx, t, func() string { return clustertest.JoinServiceLog(t, dir, "cp-0") },
		// The handshake's audit entry: refused for its measurements, naming
		// the event; no ticket follows a refused handshake.
		regexp.MustCompile(`.*"verdict":"refused","reason":"measurement_mismatch".*\.cmdline.*`))
	t.Logf("the join service's refusal of the old software: %.600s", refusal)
}

// assertNotTainted fails the test when continuous attestation tainted
// Node name.
func assertNotTainted(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gate.TaintKey }) {
		t.Fatalf("Node %s running the accepted new software is tainted: %v", name, n.Spec.Taints)
	}
}
