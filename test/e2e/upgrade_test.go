package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// steadyWorkload is a Deployment of the echo image with a replica on each
// worker, a PodDisruptionBudget that keeps one available, a NodePort
// Service, and a preStop pause so that a replica being evicted stops
// taking new connections before it exits: what a workload that must keep
// serving through node drains has.
func steadyWorkload(ctx context.Context, t *testing.T, client kubernetes.Interface, image string) int32 {
	t.Helper()
	labels := map[string]string{"app": "steady"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "steady", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// Workers only, one replica each.
					Affinity: &corev1.Affinity{
						NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
							NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
								Key: "node-role.kubernetes.io/control-plane", Operator: corev1.NodeSelectorOpDoesNotExist,
							}}}},
						}},
						PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname},
						}}},
					},
					TerminationGracePeriodSeconds: ptr.To(int64(15)),
					Containers: []corev1.Container{{
						Name: "echo", Image: image, Args: []string{"serve", ":8080"},
						Ports:           []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
						Lifecycle:       &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}},
						SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
					}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "steady", Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if _, err := client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "steady", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := client.AppsV1().Deployments("default").Get(ctx, "steady", metav1.GetOptions{})
		return err == nil && d.Status.AvailableReplicas == 2, nil
	})
	if err != nil {
		t.Fatalf("the steady workload is not available: %v", err)
	}
	return svc.Spec.Ports[0].NodePort
}

// requestCounter asks the steady workload through a NodePort, rotating
// over addresses, every 50 ms, and counts what failed.
type requestCounter struct {
	mu       sync.Mutex
	total    int
	failures []string
	stop     chan struct{}
	done     chan struct{}
}

func countRequests(addresses []string, port int32) *requestCounter {
	c := &requestCounter{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			url := fmt.Sprintf("http://%s:%d/", addresses[i%len(addresses)], port)
			resp, err := client.Get(url)
			failure := ""
			switch {
			case err != nil:
				failure = err.Error()
			case resp.StatusCode != http.StatusOK:
				failure = url + ": " + resp.Status
			}
			if resp != nil {
				_ = resp.Body.Close()
			}
			c.mu.Lock()
			c.total++
			if failure != "" {
				c.failures = append(c.failures, time.Now().Format(time.TimeOnly)+" "+failure)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// finish stops the client and returns its counts.
func (c *requestCounter) finish() (int, []string) {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, c.failures
}

// kubernetesUpgrade is the upgrade subtest: the cluster, up at the
// previous minor version, moves to the default one with `upgrade apply
// --kubernetes` while a workload behind a PodDisruptionBudget serves a
// client that counts failures; a kubelet that does not start on the last
// worker stops the roll, which a second run, after the fix, completes.
func kubernetesUpgrade(ctx context.Context, t *testing.T, bin, dir, echo, from, to string, client kubernetes.Interface, ip func(string) string) {
	kubeconfig := filepath.Join(dir, "gatehouse-admin.conf")
	kubeBin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	// A newer join service chart: version 0.2.0, upgraded in the same command.
	chartsDir := newerJoinServiceChart(t)
	// The bare pod of the earlier step has no controller: drain would
	// stop at it without --force-drain (kuberoll's drain). It runs again
	// after the roll, for the later steps.
	if err := client.CoreV1().Pods("default").Delete(ctx, "workload", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	out, err := clustertest.Gatehouse(t, bin, "upgrade", "apply", "--kubeconfig", kubeconfig, "--kubernetes", "1.37")
	if err == nil || !strings.Contains(out, `"1.37" is not supported`) {
		t.Fatalf("an unsupported version: %v\n%s", err, out)
	}
	out, err = clustertest.Gatehouse(t, bin, "upgrade", "apply", "--kubeconfig", kubeconfig, "--kubernetes", "1.34")
	if err == nil || !strings.Contains(out, "cannot be downgraded") {
		t.Fatalf("a downgrade: %v\n%s", err, out)
	}
	out, err = clustertest.Gatehouse(t, bin, "upgrade", "apply", "--kubeconfig", kubeconfig, "--kubernetes", "1.36", "--kube-bin", kubeBin, "--charts-dir", chartsDir, "--dry-run")
	if err != nil || !strings.Contains(out, fmt.Sprintf("Kubernetes %s → %s: 5 of 5 nodes to move", from, to)) || !strings.Contains(out, "kubeadm upgrade apply "+to) {
		t.Fatalf("upgrade apply --dry-run: %v\n%s", err, out)
	}
	assertVersions(ctx, t, client, from, "cp-0", "cp-1", "cp-2", "worker-1", "worker-2")

	port := steadyWorkload(ctx, t, client, echo)
	through := []string{ip("cp-0"), ip("cp-1"), ip("cp-2")}
	waitNodePort(ctx, t, through, port)
	requests := countRequests(through, port)
	// worker-2's kubelet will not start after its restart: a flag it does
	// not know, read only when it starts (kubeadm upgrade leaves the flags
	// file alone).
	flagsFile := filepath.Join(dir, "nodes", "worker-2", "root", "var", "lib", "kubelet", "kubeadm-flags.env")
	flags, err := os.ReadFile(flagsFile)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(flags), `KUBELET_KUBEADM_ARGS="`, `KUBELET_KUBEADM_ARGS="--no-such-flag-injected-by-the-test `, 1)
	if err := os.WriteFile(flagsFile, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	args := []string{"upgrade", "apply", "--kubeconfig", kubeconfig, "--kubernetes", "1.36", "--kube-bin", kubeBin,
		"--charts-dir", chartsDir, "--backup-dir", t.TempDir(), "--kubelet-timeout", "40s"}
	out, err = clustertest.Gatehouse(t, bin, args...)
	if err == nil || !strings.Contains(out, "The roll stopped at worker-2") || !strings.Contains(out, "did not become healthy") {
		t.Fatalf("a worker whose kubelet does not start did not stop the roll: %v\n%s", err, out)
	}
	if !strings.Contains(out, "Backed up every CRD") || !strings.Contains(out, "gatehouse-joinservice: upgraded 0.1.0 → 0.2.0") {
		t.Fatalf("the Gatehouse releases were not upgraded after the first control plane:\n%s", out)
	}
	t.Logf("the first run, stopped by worker-2, took %s:\n%s", time.Since(start).Round(time.Second), out)
	assertVersions(ctx, t, client, to, "cp-0", "cp-1", "cp-2", "worker-1")
	if n, err := client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("worker-2 is not left cordoned after its failure (%v)", err)
	}
	// The fix, then the same command again: it resumes at worker-2.
	if err := os.WriteFile(flagsFile, flags, 0o644); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	out, err = clustertest.Gatehouse(t, bin, args...)
	if err != nil || !strings.Contains(out, "1 of 5 nodes to move") || !strings.Contains(out, "Every node runs Kubernetes "+to) {
		t.Fatalf("the resumed upgrade: %v\n%s", err, out)
	}
	t.Logf("the resumed run took %s; the whole upgrade %s:\n%s", time.Since(resumed).Round(time.Second), time.Since(start).Round(time.Second), out)
	total, failures := requests.finish()
	t.Logf("MEASURED: the client sent %d requests through the control planes' NodePort during the upgrade; %d failed:\n%s", total, len(failures), strings.Join(failures, "\n"))
	// None may fail (docs/upgrades.md, "What the workload sees"): the
	// drains wait for the PodDisruptionBudget, and an API server's restart
	// no longer stalls the workers' heartbeats (the load balancer closes
	// its connections), which had made their pods NotReady for 25 s.
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during the upgrade", len(failures), total)
	}
	assertVersions(ctx, t, client, to, "cp-0", "cp-1", "cp-2", "worker-1", "worker-2")
	for _, n := range []string{"cp-0", "cp-1", "cp-2", "worker-1", "worker-2"} {
		node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil || node.Spec.Unschedulable {
			t.Errorf("%s is left cordoned (%v)", n, err)
		}
	}
	// kubeadm upgrade wrote each kubelet's configuration from the
	// cluster's (the first control plane's); the node's own patches went
	// over it again: every kubelet keeps its own cgroup root.
	for _, n := range []string{"cp-0", "cp-1", "cp-2", "worker-1", "worker-2"} {
		config, err := mini.Exec(ctx, dir, n, "cat", "/var/lib/kubelet/config.yaml")
		if err != nil || !regexp.MustCompile(`(?m)^cgroupRoot: /gh\d+-`+n+`$`).Match(config) {
			t.Errorf("%s's kubelet configuration after the upgrade lacks its own cgroup root (%v):\n%s", n, err, config)
		}
	}
	// The bare pod deleted before the roll runs again for the later steps.
	startWorkload(ctx, t, client)
	cm, err := client.CoreV1().ConfigMaps(charts.Namespace).Get(ctx, "gatehouse-join-config", metav1.GetOptions{})
	if err != nil || cm.Data["kubernetesVersion"] != to || !strings.Contains(cm.Data["kubernetesComponents"], kubeBin) {
		t.Errorf("the join configuration does not name %s and its build (%v): %v", to, err, cm.Data["kubernetesVersion"])
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ds, err := client.AppsV1().DaemonSets(charts.Namespace).Get(ctx, "gatehouse-joinservice", metav1.GetOptions{})
		return err == nil && ds.Status.DesiredNumberScheduled == 3 && ds.Status.UpdatedNumberScheduled == 3 && ds.Status.NumberReady == 3, nil
	})
	if err != nil {
		t.Fatalf("the upgraded join service is not ready: %v", err)
	}
}

// waitNodePort waits until the workload answers through port on every
// address: the client counts from then on (kube-proxy programs a new
// Service's NodePort a moment after it is created).
func waitNodePort(ctx context.Context, t *testing.T, addresses []string, port int32) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, a := range addresses {
			resp, err := client.Get(fmt.Sprintf("http://%s:%d/", a, port))
			if err != nil {
				return false, nil
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the steady workload does not answer through the control planes' NodePort %d: %v", port, err)
	}
}

// assertVersions requires every named Node to report kubelet version v.
func assertVersions(ctx context.Context, t *testing.T, client kubernetes.Interface, v string, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Status.NodeInfo.KubeletVersion; got != v {
			t.Errorf("%s's kubelet is %s, want %s", n, got, v)
		}
	}
}

// newerJoinServiceChart copies the charts into a directory of the test's
// with the join service's at version 0.2.0.
func newerJoinServiceChart(t *testing.T) string {
	t.Helper()
	chartsDir := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join("..", "..", "charts", "gatehouse-joinservice"), filepath.Join("..", "..", "charts", "gatehouse-keyservice"), chartsDir).CombinedOutput(); err != nil {
		t.Fatalf("copying the charts: %v\n%s", err, out)
	}
	chartFile := filepath.Join(chartsDir, "gatehouse-joinservice", "Chart.yaml")
	data, err := os.ReadFile(chartFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(chartFile, bytes.Replace(data, []byte("version: 0.1.0"), []byte("version: 0.2.0"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	return chartsDir
}
