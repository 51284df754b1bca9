// Package clustertest holds what the tests of local clusters share
// (test/e2e, test/vme2e, test/capiboot): the binaries built from this
// checkout, the CLI run with the pinned Kubernetes binaries, and a
// workload (an echo server behind a Service) to see a node serve.
package clustertest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/mini"
)

// repoRoot is the checkout this file is part of.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information to find the checkout by")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Binaries builds every binary of cmd/ into a directory of the test and
// returns it. It compiles with -trimpath as `make release`
// (internal/release) and the node image build do, so the three share the
// Go build cache's compiled packages instead of compiling the tree once
// more each.
func Binaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./cmd/...")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the binaries: %v\n%s", err, out)
	}
	return dir
}

// Gatehouse runs the gatehouse CLI in bin with args, with the tests'
// pinned Kubernetes binaries and add-ons (testenv), and returns its
// combined output.
func Gatehouse(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	kubeBin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	addons, err := testenv.AddonBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "gatehouse"), args...)
	cmd.Env = append(os.Environ(), "GATEHOUSE_KUBE_BIN="+kubeBin, testenv.AddonBinDirEnv+"="+addons)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

// Client returns a client of the cluster kubeconfig names; timeout, when
// given, bounds each request.
func Client(t *testing.T, kubeconfig string, timeout ...time.Duration) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(timeout) > 0 {
		cfg.Timeout = timeout[0]
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// NodeIP is the address of node name of the local cluster in dir (its
// node.json): the source of its connections to the join service.
func NodeIP(t *testing.T, dir, name string) string {
	t.Helper()
	spec, err := mini.ReadNodeSpec(filepath.Join(dir, "nodes", name, "node.json"))
	if err != nil {
		t.Fatal(err)
	}
	return spec.IP
}

// Writer writes each Write as a line of T's log: progress of what a test
// runs.
type Writer struct{ T *testing.T }

func (w Writer) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
