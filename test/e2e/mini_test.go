// Package e2e tests the local attested cluster end to end: `gatehouse mini
// up` with real kubeadm, kubelets and containerd on this machine.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta/cloudmetatest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// TestMiniCluster brings up three control planes (behind haproxy), two
// workers and a tampered third worker; checks the HA control plane (etcd
// members, API servers, services on every control plane), a workload on a
// worker, the tampered worker's refusal, verify on good and tampered
// nodes, an upgrade, reboots of a worker and a control plane, a control
// plane killed while serving a join, a full outage with recover; then mini
// down and that nothing is left.
func TestMiniCluster(t *testing.T) {
	testenv.RequireRoot(t)
	if err := mini.CheckPrerequisites(); err != nil {
		t.Fatalf("this machine cannot run a local cluster (make setup installs what is missing):\n%v", err)
	}
	bin := clustertest.Binaries(t)
	// A directory and a network of its own: a cluster the user started
	// with `make mini-up` (network 0, /var/lib/gatehouse-mini) runs on.
	dir := filepath.Join(t.TempDir(), "mini")
	network, err := mini.FreeNetwork(mini.DefaultNetwork + 1)
	if err != nil {
		t.Fatalf("no network for the test's cluster (`gatehouse mini down --dir <dir>` removes a cluster that holds one): %v", err)
	}
	t.Cleanup(func() {
		if out, err := clustertest.Gatehouse(t, bin, "mini", "down", "--dir", dir); err != nil {
			t.Errorf("cleanup: mini down: %v\n%s", err, out)
		}
	})
	// The cluster starts at the minor version before the default and is
	// upgraded to it half-way (the "Kubernetes and service upgrade" step).
	previous, err := testenv.PreviousBinDir()
	if err != nil {
		t.Fatal(err)
	}
	from, err := versions.Resolve(fmt.Sprintf("1.%d", defaultMinor(t)-1))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := clustertest.Gatehouse(t, bin, "mini", "up", "--dir", dir, "--network", strconv.Itoa(int(network)), "--control-planes", "3", "--workers", "3", "--tamper", "worker-3",
		"--kubelet-cert-lifetime", kubeletCertLifetime.String(), "--kubernetes-version", from.Version, "--kube-bin", previous, "--upgrade-kube-bin", defaultKubeBin(t))
	if err != nil {
		t.Fatalf("mini up: %v\n%s\n%s", err, out, nodeLogs(dir))
	}
	t.Logf("mini up on network %d took %s:\n%s", network, time.Since(start).Round(time.Second), out)
	for _, want := range []string{"Node cp-0 is Ready", "Node cp-1 is Ready", "Node cp-2 is Ready", "Node worker-1 is Ready", "Node worker-2 is Ready", "The cluster is up", "kubeconfig:"} {
		if !strings.Contains(out, want) {
			t.Errorf("mini up output lacks %q", want)
		}
	}
	if out, err := clustertest.Gatehouse(t, bin, "mini", "up", "--dir", dir); err == nil || !strings.Contains(out, "already runs") {
		t.Errorf("a second mini up: %v\n%s", err, out)
	}

	client := clustertest.Client(t, filepath.Join(dir, "gatehouse-admin.conf"))
	ctx := t.Context()
	ip := func(node string) string { return clustertest.NodeIP(t, dir, node) }
	t.Run("HA control plane", func(t *testing.T) {
		assertHA(ctx, t, dir, client, "cp-0", "cp-1", "cp-2")
		// Continuous attestation (every 10 s in the local cluster) finds
		// every node attested; the tampered worker-3 is no Node.
		waitAttested(ctx, t, client, map[string]string{
			"cp-0": "Verified", "cp-1": "Verified", "cp-2": "Verified", "worker-1": "Verified", "worker-2": "Verified",
		})
		kubeconfig, err := os.ReadFile(filepath.Join(dir, "gatehouse-admin.conf"))
		if err != nil || !strings.Contains(string(kubeconfig), "server: https://"+network.LoadBalancerIP()+":6443") {
			t.Errorf("the admin kubeconfig does not point at the load balancer (%v):\n%s", err, kubeconfig)
		}
		// Secrets are encrypted in etcd on every control plane by its KMS
		// v2 plugin (the bytes in etcd: internal/kmsplugin's test on a real
		// API server).
		for _, cp := range []string{"cp-0", "cp-1", "cp-2"} {
			pod, err := client.CoreV1().Pods("kube-system").Get(ctx, "kube-apiserver-"+cp, metav1.GetOptions{})
			if err != nil || !slices.Contains(pod.Spec.Containers[0].Command, "--encryption-provider-config=/etc/kubernetes/gatehouse/encryption-config.yaml") {
				t.Errorf("%s's API server does not encrypt Secrets (%v)", cp, err)
			}
		}
		readyz, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "true").DoRaw(ctx)
		if err != nil || !strings.Contains(string(readyz), "[+]kms-providers ok") {
			t.Errorf("the API server's KMS provider is not healthy (%v):\n%s", err, readyz)
		}
		for _, w := range []string{"worker-1", "worker-2"} {
			spec, err := mini.ReadNodeSpec(filepath.Join(dir, "nodes", w, "node.json"))
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{ip("cp-0") + ":9090", ip("cp-1") + ":9090", ip("cp-2") + ":9090"}; !slices.Equal(spec.JoinEndpoints, want) {
				t.Errorf("%s's join endpoints %v, want every control plane's %v", w, spec.JoinEndpoints, want)
			}
		}
	})
	t.Run("workload on a worker", func(t *testing.T) { startWorkload(ctx, t, client) })

	var echo string // the echo workload's image, in the cluster's registry
	t.Run("services: registry, kube-proxy, CoreDNS", func(t *testing.T) {
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			proxy, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
			if err != nil || proxy.Status.DesiredNumberScheduled != 5 || proxy.Status.NumberReady != 5 {
				return false, nil
			}
			dns, err := client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
			return err == nil && dns.Status.AvailableReplicas >= 1, nil
		})
		if err != nil {
			t.Fatalf("kube-proxy is not ready on the 5 nodes, or CoreDNS is not available: %v", err)
		}
		image := clustertest.EchoImage(t, bin, dir)
		// Pulled from the registry on worker-2, asked by name from worker-1:
		// the registry, DNS, a Service and pod traffic between nodes.
		clustertest.DeployEcho(ctx, t, client, image, "worker-2")
		clustertest.AskEcho(ctx, t, client, image, "worker-1")
		echo = image
	})
	keepsServing := func(t *testing.T) {
		t.Helper()
		if echo == "" {
			t.Fatal("the echo workload is not deployed: see the services step")
		}
		clustertest.AskEcho(ctx, t, client, echo, "worker-1")
	}

	t.Run("worker-measured machine asking for the control-plane role refused", func(t *testing.T) {
		workerAsksForControlPlane(ctx, t, dir, client)
	})

	t.Run("tampered worker refused", func(t *testing.T) {
		if _, err := client.CoreV1().Nodes().Get(ctx, "worker-3", metav1.GetOptions{}); err == nil {
			t.Fatal("the tampered worker-3 is a Node")
		}
		secrets, err := client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets.Items {
			if strings.Contains(string(s.Data["description"]), "worker-3") {
				t.Errorf("the tampered worker got bootstrap token %s", s.Name)
			}
		}
		audit := clustertest.JoinServiceLog(t, dir, "cp-*")
		refused, allowed := false, false
		for _, line := range strings.Split(audit, "\n") {
			if !strings.Contains(line, `"source":"`+ip("worker-3")+`"`) {
				continue
			}
			refused = refused || (strings.Contains(line, `"verdict":"refused"`) && strings.Contains(line, `"reason":"measurement_mismatch"`))
			allowed = allowed || strings.Contains(line, `"verdict":"allowed"`)
		}
		if !refused || allowed {
			t.Fatalf("join service audit for the tampered worker: refused for measurements %v, ever allowed %v\n%s", refused, allowed, audit)
		}
		log, _ := os.ReadFile(filepath.Join(dir, "nodes", "worker-3", "logs", "bootstrapper.log"))
		// The node learns of the refusal from the TLS alert, or, when the
		// alert loses the race against its first write, from the closed
		// connection (bootstrapper: closedAfterHandshake).
		if !strings.Contains(string(log), "The join service refused this node's attestation evidence") &&
			!strings.Contains(string(log), "it probably refused this node's attestation evidence") {
			t.Fatalf("the tampered worker's log does not say its join failed:\n%s", log)
		}
	})

	t.Run("verify", func(t *testing.T) {
		config, state := filepath.Join(dir, "gatehouse-config.yaml"), filepath.Join(dir, "gatehouse-state.json")
		// worker-1 belongs to the cluster: its evidence endpoint answers
		// only the join service and administrators.
		admin := filepath.Join(dir, "gatehouse-admin.conf")
		if out, err := clustertest.Gatehouse(t, bin, "verify", "--config", config, "--state-file", state, "--node", ip("worker-1")+":9001"); err == nil ||
			!strings.Contains(out, "refused this anonymous caller") {
			t.Fatalf("anonymous verify of a worker in the cluster: %v\n%s", err, out)
		}
		out, err := clustertest.Gatehouse(t, bin, "verify", "--config", config, "--state-file", state, "--kubeconfig", admin,
			"--node", ip("worker-1")+":9001", "--output", "json")
		if err != nil {
			t.Fatalf("verify worker-1: %v\n%s", err, out)
		}
		var report struct {
			ClusterID    string            `json:"clusterID"`
			Measurements map[string]string `json:"measurements"`
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil || report.ClusterID == "" || report.Measurements["15"] == "" {
			t.Fatalf("verify report %v: %s", err, out)
		}
		out, err = clustertest.Gatehouse(t, bin, "verify", "--config", config, "--node", ip("worker-3")+":9001")
		if err == nil || !strings.Contains(out, "does not verify") || !strings.Contains(out, "index 4") {
			t.Fatalf("verify of the tampered worker: %v\n%s", err, out)
		}
	})

	t.Run("Kubernetes and service upgrade", func(t *testing.T) {
		if echo == "" {
			t.Fatal("the echo image is not built: see the services step")
		}
		kubernetesUpgrade(ctx, t, bin, dir, echo, from.Version, versions.Default().Version, client, ip)
		// Every node still proven, etcd with a healthy member on each
		// control plane.
		waitAttested(ctx, t, client, map[string]string{
			"cp-0": "Verified", "cp-1": "Verified", "cp-2": "Verified", "worker-1": "Verified", "worker-2": "Verified",
		})
		assertHA(ctx, t, dir, client, "cp-0", "cp-1", "cp-2")
	})

	t.Run("reboot and rejoin", func(t *testing.T) {
		rejoin := []string{`"method":"IssueRejoinTicket"`, `"verdict":"allowed"`}
		rejoinsBefore := clustertest.AuditCount(clustertest.JoinServiceLog(t, dir, "cp-*"), ip("worker-1"), rejoin...)
		rebooted := time.Now()
		if out, err := clustertest.Gatehouse(t, bin, "mini", "node", "reboot", "--dir", dir, "worker-1"); err != nil {
			t.Fatalf("mini node reboot: %v\n%s", err, out)
		}
		// The node rejoins through the join service after the reboot (its
		// TPM measured again, PCR 15 zero), its bootstrapper finishes,
		// its kubelet posts status again and its workload runs again.
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			status, _ := os.ReadFile(filepath.Join(dir, "nodes", "worker-1", "bootstrap.status"))
			node, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil || strings.TrimSpace(string(status)) != "ok" {
				return false, nil
			}
			if !readySince(node, rebooted) {
				return false, nil
			}
			// The workload's container was killed with the node and started
			// again after the reboot.
			pod, err := client.CoreV1().Pods("default").Get(ctx, "workload", metav1.GetOptions{})
			if err != nil || pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) == 0 {
				return false, nil
			}
			running := pod.Status.ContainerStatuses[0].State.Running
			return running != nil && running.StartedAt.After(rebooted), nil
		})
		if err != nil {
			t.Fatalf("worker-1 is not Ready with its workload after the reboot: %v\n%s", err, nodeLogs(dir))
		}
		if audit := clustertest.JoinServiceLog(t, dir, "cp-*"); clustertest.AuditCount(audit, ip("worker-1"), rejoin...) <= rejoinsBefore {
			t.Fatalf("the join service did not issue worker-1 a rejoin ticket after its reboot:\n%s", audit)
		}
		keepsServing(t)
	})

	t.Run("reboot a control plane", func(t *testing.T) {
		rebooted := time.Now()
		// The API servers keep answering through the load balancer.
		stop := watchAPI(ctx, t, dir)
		if out, err := clustertest.Gatehouse(t, bin, "mini", "node", "reboot", "--dir", dir, "cp-1"); err != nil {
			t.Fatalf("mini node reboot cp-1: %v\n%s", err, out)
		}
		waitRejoined(ctx, t, dir, client, "cp-1", rebooted)
		assertHA(ctx, t, dir, client, "cp-0", "cp-1", "cp-2")
		if failed, total := stop(); failed > 0 || total == 0 {
			t.Errorf("%d of %d requests through the load balancer failed while cp-1 rebooted", failed, total)
		}
		keepsServing(t)
	})

	t.Run("control plane killed while serving a join", func(t *testing.T) {
		out, err := clustertest.Gatehouse(t, bin, "mini", "node", "add", "--dir", dir)
		if err != nil || !strings.Contains(out, "worker-4 is joining") {
			t.Fatalf("mini node add: %v\n%s", err, out)
		}
		// The new worker asks cp-0's join service first. Once that service
		// has issued its ticket (its bootstrap token exists) and before the
		// node is registered, cp-0 goes down: kubeadm join must complete
		// through the other API servers, behind the load balancer.
		var token string
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			token = tokenFor(ctx, client, "worker-4")
			return token != "", nil
		})
		if err != nil {
			t.Fatalf("no join ticket for worker-4: %v\n%s", err, nodeLogs(dir))
		}
		if _, err := client.CoreV1().Nodes().Get(ctx, "worker-4", metav1.GetOptions{}); err == nil {
			t.Fatal("worker-4 registered before cp-0 could be stopped: the fault would miss the join")
		}
		killed := time.Now()
		if out, err := clustertest.Gatehouse(t, bin, "mini", "node", "reboot", "--dir", dir, "cp-0"); err != nil {
			t.Fatalf("mini node reboot cp-0: %v\n%s", err, out)
		}
		var node *corev1.Node
		err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
			node, err = client.CoreV1().Nodes().Get(ctx, "worker-4", metav1.GetOptions{})
			return err == nil && readySince(node, killed), nil
		})
		if err != nil {
			t.Fatalf("worker-4 did not join with cp-0 down: %v\n%s", err, nodeLogs(dir))
		}
		// Joined after the upgrade: at the new version.
		if got, want := node.Status.NodeInfo.KubeletVersion, versions.Default().Version; got != want {
			t.Errorf("worker-4 joined after the upgrade with kubelet %s, want %s", got, want)
		}
		// The fault hit the join: the Node was registered after cp-0 went
		// down (creation times have whole seconds).
		if node.CreationTimestamp.Time.Before(killed.Truncate(time.Second)) {
			t.Fatalf("worker-4 was registered at %s, before cp-0 went down at %s: the fault missed the join", node.CreationTimestamp, killed)
		}
		for _, cp := range []string{"cp-0", "cp-1", "cp-2"} {
			t.Logf("%s's join service issued %d join ticket(s) to worker-4", cp,
				clustertest.AuditCount(clustertest.JoinServiceLog(t, dir, cp), ip("worker-4"), `"method":"IssueJoinTicket"`, `"verdict":"allowed"`))
		}
		waitRejoined(ctx, t, dir, client, "cp-0", killed)
		assertHA(ctx, t, dir, client, "cp-0", "cp-1", "cp-2")
	})

	t.Run("flood on a worker's evidence port leaves it Verified", func(t *testing.T) {
		testEvidenceFlood(ctx, t, dir, client, "worker-1", ip("worker-1")+":9001")
	})

	t.Run("compromised running worker tainted, restored by policy", func(t *testing.T) {
		// A real Prometheus scrapes the join services with the chart's
		// alerts, their "for" short (test/e2e/prometheus_test.go).
		prom := startPrometheus(ctx, t, []string{ip("cp-0") + ":9091", ip("cp-1") + ":9091", ip("cp-2") + ":9091"},
			map[string]any{"nodeNotAttestedFor": "2s"})
		prom.waitScraped(ctx, t, 3, "worker-4")
		testCompromisedWorker(ctx, t, dir, client, "worker-4", "worker-1", prom)
	})

	t.Run("kubelet certificates renewed after fresh evidence", func(t *testing.T) {
		testKubeletRenewal(ctx, t, client, "worker-1")
	})

	t.Run("rebooted node measuring otherwise stays out", func(t *testing.T) {
		refusal := []string{`"verdict":"refused"`, `"reason":"measurement_mismatch"`}
		audit := clustertest.JoinServiceLog(t, dir, "cp-*")
		w4 := ip("worker-4")
		refusalsBefore, allowedBefore := clustertest.AuditCount(audit, w4, refusal...), clustertest.AuditCount(audit, w4, `"verdict":"allowed"`)
		agentLog := filepath.Join(dir, "nodes", "worker-4", "logs", "agent.log")
		logBefore, _ := os.ReadFile(agentLog)
		if out, err := clustertest.Gatehouse(t, bin, "mini", "node", "reboot", "--dir", dir, "--tamper", "worker-4"); err != nil {
			t.Fatalf("mini node reboot --tamper: %v\n%s", err, out)
		}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
			audit = clustertest.JoinServiceLog(t, dir, "cp-*")
			return clustertest.AuditCount(audit, w4, refusal...) > refusalsBefore, nil
		})
		if err != nil {
			t.Fatalf("the join service did not refuse the tampered reboot of worker-4: %v\n%s", err, audit)
		}
		if clustertest.AuditCount(audit, w4, `"verdict":"allowed"`) > allowedBefore {
			t.Fatalf("the join service allowed worker-4 after a tampered reboot:\n%s", audit)
		}
		if _, err := os.Stat(filepath.Join(dir, "nodes", "worker-4", "bootstrap.status")); err == nil {
			t.Fatal("the tampered node's bootstrapper finished")
		}
		// Its Node is still there; continuous attestation fetches its
		// fresh (changed) evidence and marks it not attested.
		waitAttested(ctx, t, client, map[string]string{"worker-4": "EvidenceRejected"})
		// and taints it (the policy's default action), so its pods move.
		err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := client.CoreV1().Nodes().Get(ctx, "worker-4", metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == gate.TaintKey && t.Effect == corev1.TaintEffectNoExecute
			}), nil
		})
		if err != nil {
			t.Fatalf("worker-4 is not tainted %s:NoExecute after failing continuous attestation: %v", gate.TaintKey, err)
		}
		logAfter, _ := os.ReadFile(agentLog)
		if since := string(logAfter[min(len(logBefore), len(logAfter)):]); !strings.Contains(since, "the kubelet waits for the bootstrapper") ||
			strings.Contains(since, "Starting the kubelet") {
			t.Fatalf("the tampered node's kubelet started, or did not wait:\n%s", since)
		}
	})

	t.Run("full outage and recover", func(t *testing.T) {
		// Data written before the outage: a file on a hostPath volume of
		// worker-1, and a ConfigMap.
		if echo == "" {
			t.Fatal("the echo workload is not deployed: see the services step")
		}
		data := ptr.To("/srv/e2e")
		clustertest.RunPod(ctx, t, client, echo, "worker-1", []string{"write", "/data/before-the-outage", "written before the outage"}, data)
		if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "before-the-outage"}, Data: map[string]string{"written": "before"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// And a Secret, encrypted in etcd: after a cold start each API
		// server needs its control plane's KMS v2 plugin to read it.
		if _, err := client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "before-the-outage"}, StringData: map[string]string{"written": "before"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "stop", "--dir", dir); err != nil {
			t.Fatalf("mini stop: %v\n%s", err, out)
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "status", "--dir", dir); err != nil || strings.Count(out, "bootstrap: off") != 7 {
			t.Fatalf("mini status of a stopped cluster (want its 7 nodes off): %v\n%s", err, out)
		}
		started := time.Now()
		out, err := clustertest.Gatehouse(t, bin, "mini", "start", "--dir", dir)
		if err != nil || !strings.Contains(out, "gatehouse recover") {
			t.Fatalf("mini start: %v\n%s", err, out)
		}
		// Nothing can unlock the control plane but recover: no API server
		// answers (a short request timeout, so the poll is not one long wait).
		short := clustertest.Client(t, filepath.Join(dir, "gatehouse-admin.conf"), 2*time.Second)
		if _, err := short.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
			t.Fatal("the API server answers before recover")
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "status", "--dir", dir); err != nil || !strings.Contains(out, "waiting to be recovered") ||
			!strings.Contains(out, "The API server does not answer") {
			t.Fatalf("mini status before recover: %v\n%s", err, out)
		}
		config := filepath.Join(dir, "gatehouse-config.yaml")
		out, err = clustertest.Gatehouse(t, bin, "recover", "--config", config, "--master-secret-file", filepath.Join(dir, "gatehouse-master-secret.json"),
			"--endpoint", ip("cp-0")+":9000", "--endpoint", ip("cp-1")+":9000", "--endpoint", ip("cp-2")+":9000")
		if err != nil || !strings.Contains(out, "Recovered 3 control plane") {
			t.Fatalf("recover: %v\n%s\n%s", err, out, nodeLogs(dir))
		}
		// The cluster is back with its data; worker-1 rejoined by itself.
		err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
			cm, err := short.CoreV1().ConfigMaps("default").Get(ctx, "before-the-outage", metav1.GetOptions{})
			if err != nil || cm.Data["written"] != "before" {
				return false, nil
			}
			sec, err := short.CoreV1().Secrets("default").Get(ctx, "before-the-outage", metav1.GetOptions{})
			if err != nil || string(sec.Data["written"]) != "before" {
				return false, nil
			}
			for _, name := range []string{"cp-0", "cp-1", "cp-2", "worker-1", "worker-2"} {
				node, err := short.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil || !readySince(node, started) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("the cluster is not back after recover: %v\n%s", err, nodeLogs(dir))
		}
		for _, cp := range []string{"cp-0", "cp-1", "cp-2"} {
			if status, _ := os.ReadFile(filepath.Join(dir, "nodes", cp, "bootstrap.status")); strings.TrimSpace(string(status)) != "ok" {
				t.Fatalf("%s's bootstrap status after recover: %q", cp, status)
			}
		}
		assertHA(ctx, t, dir, client, "cp-0", "cp-1", "cp-2")
		// Kubelet client certificates live 3 minutes here: those that
		// expired during the outage were renewed as the nodes came back.
		for _, n := range []string{"cp-0", "cp-1", "cp-2", "worker-1", "worker-2"} {
			if log, _ := os.ReadFile(filepath.Join(dir, "nodes", n, "logs", "bootstrapper.log")); strings.Contains(string(log), "client certificate has expired") {
				t.Logf("%s's kubelet client certificate expired during the outage and was renewed", n)
			}
		}
		if got := clustertest.RunPod(ctx, t, client, echo, "worker-1", []string{"cat", "/data/before-the-outage"}, data); got != "written before the outage\n" {
			t.Fatalf("the hostPath file after the outage holds %q", got)
		}
		keepsServing(t)
	})

	// A worker on each cloud takes its identity from that cloud's metadata
	// service, as it answers, where it answers: 169.254.169.254:80 in the
	// node's own network namespace (docs/cloud.md). The bootstrapper asks
	// it until it answers.
	for _, cloud := range []struct {
		name       string
		serve      func(name, ip string, endpoints map[string]string) http.Handler
		providerID func(name string) string
	}{
		{"gce", func(name, ip string, attrs map[string]string) http.Handler {
			return cloudmetatest.GCE(cloudmetatest.Instance{Name: name, Project: "gatehouse-local", ProjectNumber: "123456789012",
				Zone: "local-a", IPs: []string{ip}, Attributes: attrs})
		}, func(name string) string { return "gce://gatehouse-local/local-a/" + name }},
		{"aws", func(name, ip string, tags map[string]string) http.Handler {
			return cloudmetatest.AWS(cloudmetatest.Instance{Name: name, ID: "i-0123456789abcdef0", Region: "eu-local-1",
				Zone: "eu-local-1a", IPs: []string{ip}, Attributes: tags})
		}, func(string) string { return "aws:///eu-local-1a/i-0123456789abcdef0" }},
		{"azure", func(name, ip string, tags map[string]string) http.Handler {
			return cloudmetatest.Azure(cloudmetatest.Instance{Name: name, ID: "7df7b373-b947-4aaa-96e5-c358f2a03d20",
				Project: "00000000-0000-0000-0000-000000000001", ResourceGroup: "gatehouse-local", Region: "localeurope",
				Zone: "1", IPs: []string{ip}, Attributes: tags})
		}, func(name string) string {
			return "azure:///subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/gatehouse-local/providers/Microsoft.Compute/virtualMachines/" + name
		}},
	} {
		t.Run("a worker on "+cloud.name+" takes its identity from instance metadata", func(t *testing.T) {
			out, err := clustertest.Gatehouse(t, bin, "mini", "node", "add", "--dir", dir, "--cloud-metadata", cloud.name)
			name, _, _ := strings.Cut(strings.TrimSpace(out[strings.LastIndex(out, "\nworker-")+1:]), " ")
			if err != nil || !strings.Contains(out, name+" is joining") {
				t.Fatalf("mini node add --cloud-metadata %s: %v\n%s", cloud.name, err, out)
			}
			spec, err := mini.ReadNodeSpec(filepath.Join(dir, "nodes", name, "node.json"))
			if err != nil {
				t.Fatal(err)
			}
			lis := testkit.ListenInNetNS(t, "/run/netns/"+spec.NetNS, "169.254.169.254:80")
			srv := &http.Server{Handler: cloud.serve(name, spec.IP, map[string]string{"gatehouse-join-endpoints": strings.Join(spec.JoinEndpoints, ",")}),
				ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(lis) }()
			defer srv.Close()
			var node *corev1.Node
			err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				node, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				return err == nil && readySince(node, time.Time{}), nil
			})
			if err != nil {
				t.Fatalf("%s did not join from its %s metadata: %v\n%s", name, cloud.name, err, nodeLogs(dir))
			}
			if want := cloud.providerID(name); node.Spec.ProviderID != want {
				t.Errorf("%s's providerID is %q, want %q (from its instance metadata)", name, node.Spec.ProviderID, want)
			}
		})
	}

	var rec *mini.Record
	if rec, err = mini.ReadRecord(dir); err != nil {
		t.Fatal(err)
	}
	if out, err := clustertest.Gatehouse(t, bin, "mini", "down", "--dir", dir); err != nil {
		t.Fatalf("mini down: %v\n%s", err, out)
	}
	assertNothingLeft(t, rec)
}

// clusterNetwork is the network of the local cluster in dir.
func clusterNetwork(t *testing.T, dir string) mini.Network {
	t.Helper()
	rec, err := mini.ReadRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Network
}

// readySince reports whether node is Ready with a heartbeat after t.
func readySince(node *corev1.Node, t time.Time) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(t)
		}
	}
	return false
}

func nodeLogs(dir string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "logs", "*.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		b.WriteString("== " + f + "\n" + strings.Join(lines, "\n") + "\n")
	}
	return b.String()
}

// assertNothingLeft checks that no namespace, link, process, mount, cgroup,
// loop device or file of the cluster remains.
func assertNothingLeft(t *testing.T, rec *mini.Record) {
	t.Helper()
	netns, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	links, _ := exec.Command("ip", "-o", "link").CombinedOutput()
	loops, _ := exec.Command("losetup", "-a").CombinedOutput()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, n := range rec.Nodes {
		if strings.Contains(string(netns), n.NetNS) {
			t.Errorf("network namespace %s remains", n.NetNS)
		}
		if strings.Contains(string(links), n.HostVeth+"@") {
			t.Errorf("link %s remains", n.HostVeth)
		}
		if strings.Contains(string(loops), filepath.Join(n.Dir, "state-disk.img")) {
			t.Errorf("the loop device of %s remains", n.Name)
		}
		// By namespace and what it mounts: the namespace's number may since
		// have been given to another cluster's node's (the kernel reuses them).
		for _, pid := range mini.NodeProcesses(n) {
			t.Errorf("process %d of node %s remains", pid, n.Name)
		}
		matches, _ := filepath.Glob("/sys/fs/cgroup/*" + n.CgroupRoot)
		if len(matches) > 0 {
			t.Errorf("cgroups of %s remain: %v", n.Name, matches)
		}
	}
	for what, pid := range map[string]int{"haproxy": rec.LoadBalancerPID, "registry": rec.RegistryPID} {
		if pid <= 0 {
			t.Errorf("the record names no %s process", what)
			continue
		}
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), what) {
			t.Errorf("%s (pid %d) remains", what, pid)
		}
	}
	if strings.Contains(string(netns), "cni-") {
		t.Errorf("pod network namespaces remain:\n%s", netns)
	}
	if strings.Contains(string(links), rec.Bridge+":") {
		t.Errorf("bridge %s remains", rec.Bridge)
	}
	if strings.Contains(string(mounts), rec.Dir) {
		t.Error("mounts of the cluster directory remain")
	}
	if _, err := os.Stat(rec.Dir); !os.IsNotExist(err) {
		t.Errorf("the cluster directory %s remains", rec.Dir)
	}
}

// defaultMinor is the default Kubernetes release's minor version.
func defaultMinor(t *testing.T) int {
	t.Helper()
	var minor, patch int
	if _, err := fmt.Sscanf(versions.Default().Version, "v1.%d.%d", &minor, &patch); err != nil {
		t.Fatal(err)
	}
	return minor
}

// defaultKubeBin is the default release's build ($GATEHOUSE_KUBE_BIN).
func defaultKubeBin(t *testing.T) string {
	t.Helper()
	dir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// startWorkload runs pod "workload" (no controller) on worker-1 and waits
// until it runs.
func startWorkload(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "workload", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{
			Name: "workload", Image: mini.ImageRepository + "/pause:3.10.2", ImagePullPolicy: corev1.PullNever,
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
		}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, "workload", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("the workload pod is not Running on worker-1: %v", err)
	}
}
