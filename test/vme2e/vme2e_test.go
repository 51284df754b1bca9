//go:build vmnodes

package vme2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// Where the test's cluster lives: its own network and directory.
const (
	network    = 5
	clusterDir = "/var/lib/gatehouse-mini-vm"
)

// joinTimeout bounds a VM's boot to Ready under TCG (measured: 3.5 min
// on an idle 2-core machine, where make test runs this step; 35 min at
// load 20, docs/benchmarks.md).
const joinTimeout = 20 * time.Minute

func TestVMWorker(t *testing.T) {
	testenv.RequireRoot(t)
	image, err := testenv.NodeImageDir()
	if err != nil {
		// make test-vm sets the image: a run without one is a broken set-up, not a pass.
		t.Fatal(err)
	}
	bin := clustertest.Binaries(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the VM's console: %s", mini.VMConsoleLog(clusterDir, "worker-1"))
			if os.Getenv("GATEHOUSE_KEEP_CLUSTER") != "" {
				return
			}
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "down", "--dir", clusterDir); err != nil {
			t.Errorf("cleanup: mini down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	// Every image through the mirror (mirror_test.go).
	out, err := clustertest.Gatehouse(t, bin, "mini", "up", "--dir", clusterDir, "--network", strconv.Itoa(network), "--workers", "0", "--node-image", image.Dir, "--mirror-images")
	if err != nil {
		t.Fatalf("mini up: %v\n%s", err, out)
	}
	t.Logf("mini up (one namespace control plane) took %s", time.Since(start).Round(time.Second))
	client := clustertest.Client(t, filepath.Join(clusterDir, "gatehouse-admin.conf"))
	ctx := t.Context()

	// The VM worker joins through the join service.
	start = time.Now()
	name, err := mini.AddWorker(ctx, clusterDir, mini.WorkerOptions{Provider: mini.ProviderQEMU, NodeImage: image.Dir}, clustertest.Writer{T: t})
	if err != nil {
		t.Fatalf("adding a VM worker: %v", err)
	}
	waitReady(ctx, t, client, clusterDir, name, start)
	t.Logf("MEASURED: VM worker %s from QEMU's start to Node Ready: %s", name, time.Since(start).Round(time.Second))
	logMemory(t, clusterDir, name)
	first := waitStateOpened(ctx, t, clusterDir, name, 1)
	if first.opened != 1 {
		t.Fatalf("the first opening of the state disk counts %d boots", first.opened)
	}
	waitKubeletCertificate(ctx, t, client, name)
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)

	// The VM serves a workload: an image from the cluster's registry runs
	// on it behind a Service, which a pod on the namespace control plane
	// reaches by its DNS name across the two kinds of node. Its name is
	// Docker Hub's, which only the mirror serves.
	reg := mini.Network(network).RegistryAddress()
	echo := mirrorEcho(ctx, t, clustertest.EchoImage(t, bin, clusterDir), reg)
	clustertest.DeployEcho(ctx, t, client, echo, name)
	clustertest.AskEcho(ctx, t, client, echo, "cp-0")
	// The VM pulled every image it runs through the mirror.
	before := assertVMPulledFromMirror(ctx, t, client, clusterDir, name, reg)

	// A real reboot: the reset line; the firmware measures again into a
	// TPM whose PCRs start from zero; the node rejoins and opens its
	// state disk, whose record says it was made in the first boot.
	start = time.Now()
	if err := mini.RebootNode(ctx, clusterDir, name, false, clustertest.Writer{T: t}); err != nil {
		t.Fatal(err)
	}
	second := waitStateOpened(ctx, t, clusterDir, name, 2)
	if second.createdInBoot != first.thisBoot || second.thisBoot == first.thisBoot {
		t.Fatalf("after the reset the state disk says %+v; before it %+v: its state did not survive", second, first)
	}
	waitReady(ctx, t, client, clusterDir, name, start)
	t.Logf("MEASURED: VM worker %s from its reset to Node Ready again: %s", name, time.Since(start).Round(time.Second))
	logMemory(t, clusterDir, name)
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)
	// Its pod runs again after the reboot and serves: its image, gone with
	// the VM's memory, pulled again through the mirror (the hosts files
	// are on the state disk).
	clustertest.WaitAvailable(ctx, t, client, "default", "echo")
	clustertest.AskEcho(ctx, t, client, echo, "cp-0")
	if after := assertVMPulledFromMirror(ctx, t, client, clusterDir, name, reg); after[echoRepo()] <= before[echoRepo()] {
		t.Errorf("after its reboot %s pulled %s no more through the mirror (%d manifests before, %d after)", name, echoUpstream, before[echoRepo()], after[echoRepo()])
	}
	raw, err := os.ReadFile(filepath.Join(clusterDir, "nodes", name, "vm", "state.raw"))
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{first.thisBoot, "gatehouse-state.json", "lost+found"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("the state disk's bytes on the host contain %q: not ciphertext", plain)
		}
	}

	// The node software moves (docs/upgrades.md): the policy accepts the
	// next software's signed values, the worker restarts on it and stays
	// Verified, the old values are retired, and the worker restarted on the
	// old software is tainted and refused naming the .cmdline event.
	moveNodeSoftware(ctx, t, client, bin, clusterDir, name, image)
}

// record is what the bootstrapper logs when it opened the state disk.
type record struct {
	createdInBoot, thisBoot string
	opened                  int
}

var stateOpened = regexp.MustCompile(`The state disk is open and holds the node's state.*`)

// waitStateOpened waits for the opening of the state disk that counts n
// boots on the VM's console and returns its record. (A reset keeps the
// console of earlier boots, a power cut and a new QEMU does not.)
func waitStateOpened(ctx context.Context, t *testing.T, dir, name string, n int) record {
	t.Helper()
	var last record
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, joinTimeout, true, func(context.Context) (bool, error) {
		data, err := os.ReadFile(mini.VMConsoleLog(dir, name))
		if err != nil {
			return false, nil
		}
		for _, line := range stateOpened.FindAllString(string(data), -1) {
			if last = parseRecord(t, line); last.opened == n {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s's state disk to be opened in boot %d: %v (last: %+v; console: %s)", name, n, err, last, mini.VMConsoleLog(dir, name))
	}
	return last
}

func parseRecord(t *testing.T, line string) record {
	t.Helper()
	field := func(name string) string {
		m := regexp.MustCompile(`"` + name + `":"?([^",}]*)`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%q lacks %s", line, name)
		}
		return m[1]
	}
	n, err := strconv.Atoi(field("bootsOpened"))
	if err != nil {
		t.Fatal(err)
	}
	return record{createdInBoot: field("createdInBoot"), thisBoot: field("thisBoot"), opened: n}
}

// waitReady waits for Node name of the cluster in dir to be Ready with a
// heartbeat after since.
func waitReady(ctx context.Context, t *testing.T, client kubernetes.Interface, dir, name string, since time.Time) {
	t.Helper()
	state := "not registered"
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, joinTimeout, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				state = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(since), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for Node %s to be Ready: %v (last: %s; console: %s)", name, err, state, mini.VMConsoleLog(dir, name))
	}
}

// waitKubeletCertificate waits for an issued certificate of the node's
// kubelet (its client certificate, approved by the join service).
func waitKubeletCertificate(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		csrs, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range csrs.Items {
			// Requested with the join ticket's bootstrap token: the CSR's
			// subject names the node.
			block, _ := pem.Decode(c.Spec.Request)
			if block == nil || len(c.Status.Certificate) == 0 {
				continue
			}
			req, err := x509.ParseCertificateRequest(block.Bytes)
			if err == nil && req.Subject.CommonName == "system:node:"+name {
				t.Logf("kubelet certificate of %s issued: CSR %s (%s, requested by %s)", name, c.Name, c.Spec.SignerName, c.Spec.Username)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no issued kubelet certificate for %s: %v", name, err)
	}
}

// waitAttested waits for continuous attestation's verdict on the Node.
func waitAttested(ctx context.Context, t *testing.T, client kubernetes.Interface, name, reason string) {
	t.Helper()
	got := "no condition"
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == continuous.ConditionType {
				got = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Reason == reason, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("continuous attestation of %s: want %s, got %s", name, reason, got)
	}
	t.Logf("continuous attestation of %s: %s", name, got)
}

// waitTainted waits for the unattested taint on the Node.
func waitTainted(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	got := "no condition"
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, joinTimeout, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == continuous.ConditionType {
				got = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == gate.TaintKey && t.Effect == corev1.TaintEffectNoExecute
		}), nil
	})
	if err != nil {
		t.Fatalf("Node %s was not tainted: %v (its attestation condition: %s)", name, err, got)
	}
	t.Logf("Node %s tainted; its attestation condition: %s", name, got)
}

// waitLog waits for re in what text returns.
func waitLog(ctx context.Context, t *testing.T, text func() string, re *regexp.Regexp) string {
	t.Helper()
	var found string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(context.Context) (bool, error) {
		found = re.FindString(text())
		return found != "", nil
	})
	if err != nil {
		t.Fatalf("waiting for %q: %v", re, err)
	}
	return found
}

// logMemory logs the memory of VM name of the cluster in dir on the host:
// QEMU's resident set.
func logMemory(t *testing.T, dir, name string) {
	t.Helper()
	qemuPID, tpmPID, err := mini.VMPIDs(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURED: VM %s memory on the host: QEMU %s (guest memory %d MiB), swtpm %s", name, rss(qemuPID), mini.VMMemoryMiB, rss(tpmPID))
}

func rss(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.Join(strings.Fields(strings.TrimPrefix(l, "VmRSS:")), " ")
		}
	}
	return "?"
}
