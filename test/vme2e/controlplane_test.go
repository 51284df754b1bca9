//go:build vmnodes && vmcontrolplane

package vme2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// Where the VM control plane's cluster lives, beside TestVMWorker's.
const (
	cpNetwork    = 7
	cpClusterDir = "/var/lib/gatehouse-mini-vmcp"
)

// TestVMControlPlane makes a cluster whose only node is a VM control
// plane (`mini up --provider qemu`): the real bootstrapper in the VM is
// attested and initialises the cluster with kubeadm. Then a power cut
// (`mini stop`) and `mini start`: with its only control plane down no join
// service can unlock it, so the VM waits for `gatehouse recover` (the
// command mini start prints), which verifies it and sends it its state
// disk's key; the node opens the same dm-crypt disk and the cluster's
// state (a ConfigMap in etcd on that disk) survives.
//
// It takes about 16 min under TCG, beyond what CI's budget leaves after
// the other VM tests: `make test-vm-controlplane` runs it (tag
// vmcontrolplane), `make test` does not (docs/development.md).
func TestVMControlPlane(t *testing.T) {
	testenv.RequireRoot(t)
	image, err := testenv.NodeImageDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := clustertest.Binaries(t)
	const name = "cp-0"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the VM's console: %s", mini.VMConsoleLog(cpClusterDir, name))
			if os.Getenv("GATEHOUSE_KEEP_CLUSTER") != "" {
				return
			}
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "down", "--dir", cpClusterDir); err != nil {
			t.Errorf("cleanup: mini down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	out, err := clustertest.Gatehouse(t, bin, "mini", "up", "--dir", cpClusterDir, "--network", strconv.Itoa(cpNetwork),
		"--provider", mini.ProviderQEMU, "--control-planes", "1", "--workers", "0", "--node-image", image.Dir)
	if err != nil {
		t.Fatalf("mini up --provider qemu: %v\n%s", err, out)
	}
	t.Logf("MEASURED: mini up with a VM control plane (QEMU's start to the cluster initialised): %s", time.Since(start).Round(time.Second))
	client := clustertest.Client(t, filepath.Join(cpClusterDir, "gatehouse-admin.conf"))
	ctx := t.Context()
	waitReady(ctx, t, client, cpClusterDir, name, start)
	t.Logf("MEASURED: VM control plane from QEMU's start to Node Ready: %s", time.Since(start).Round(time.Second))
	logMemory(t, cpClusterDir, name)
	first := waitStateOpened(ctx, t, cpClusterDir, name, 1)
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)

	// State the cluster keeps in etcd, on the VM's dm-crypt state disk.
	marker := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "survives-power-cut", Namespace: "default"},
		Data:       map[string]string{"boot": first.thisBoot},
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, marker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A power cut: QEMU and swtpm stop; the disks stay.
	qemuPID, tpmPID, err := mini.VMPIDs(cpClusterDir, name)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := clustertest.Gatehouse(t, bin, "mini", "stop", "--dir", cpClusterDir); err != nil {
		t.Fatalf("mini stop: %v\n%s", err, out)
	}
	for _, pid := range []int{qemuPID, tpmPID} {
		if testenv.ProcessAlive(pid) {
			t.Errorf("process %d of the VM is still running after mini stop", pid)
		}
	}
	start = time.Now()
	out, err = clustertest.Gatehouse(t, bin, "mini", "start", "--dir", cpClusterDir)
	if err != nil {
		t.Fatalf("mini start: %v\n%s", err, out)
	}
	recoverArgs := recoverCommand(t, out)
	// The VM boots for minutes under TCG; recover waits for it to answer.
	out, err = clustertest.Gatehouse(t, bin, recoverArgs...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(recoverArgs, " "), err, out)
	}
	t.Logf("gatehouse recover:\n%s", out)
	second := waitStateOpened(ctx, t, cpClusterDir, name, 2)
	if second.createdInBoot != first.thisBoot || second.thisBoot == first.thisBoot {
		t.Fatalf("after the power cut the state disk says %+v; before it %+v: its state did not survive", second, first)
	}
	waitReady(ctx, t, client, cpClusterDir, name, start)
	t.Logf("MEASURED: VM control plane from mini start to Node Ready again (recovered): %s", time.Since(start).Round(time.Second))
	got, err := client.CoreV1().ConfigMaps("default").Get(ctx, marker.Name, metav1.GetOptions{})
	if err != nil || got.Data["boot"] != first.thisBoot {
		t.Fatalf("the ConfigMap made before the power cut: %v, %v", got, err)
	}
	waitAttested(ctx, t, client, name, continuous.ReasonVerified)
}

// recoverCommand returns the arguments of the gatehouse recover command
// that mini start printed.
func recoverCommand(t *testing.T, out string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 2 && fields[0] == "gatehouse" && fields[1] == "recover" {
			return fields[1:]
		}
	}
	t.Fatalf("mini start printed no gatehouse recover command:\n%s", out)
	return nil
}
