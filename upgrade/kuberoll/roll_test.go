package kuberoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// cluster is a fake cluster: Nodes, kubeadm's configuration, and the
// control planes' static pods as mirror pods.
func cluster(t *testing.T, version string, nodes ...string) *fake.Clientset {
	t.Helper()
	objs := []runtime.Object{&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: metav1.NamespaceSystem},
		Data:       map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: " + version + "\n"},
	}}
	for i, name := range nodes {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
			Status: corev1.NodeStatus{
				NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: version, Architecture: "amd64"},
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.0.%d", i+10)}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			},
		}
		if strings.HasPrefix(name, "cp-") {
			n.Labels[controlPlaneLabel] = ""
			for _, c := range []string{"etcd", "kube-apiserver"} {
				objs = append(objs, staticPod(c, name, version))
			}
		}
		objs = append(objs, n)
	}
	return fake.NewClientset(objs...)
}

func staticPod(component, node, version string) *corev1.Pod {
	tag := version
	if component == "etcd" {
		tag = "3.6.6-0"
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: component + "-" + node, Namespace: metav1.NamespaceSystem,
			Annotations: map[string]string{"kubernetes.io/config.mirror": "x"}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: component, Image: "registry.k8s.io/" + component + ":" + tag}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// agents is a fake fleet of upgrade agents: it records each call and
// moves the fake node as the real one would.
type agents struct {
	client kubernetes.Interface
	mu     sync.Mutex
	calls  []string
	fail   map[string]error // "node step" → error
}

func (a *agents) Upgrade(ctx context.Context, address string, req *upgradeagentv1.UpgradeRequest, progress func(string)) error {
	nodes, err := a.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var node *corev1.Node
	for i := range nodes.Items {
		if nodes.Items[i].Status.Addresses[0].Address == address {
			node = &nodes.Items[i]
		}
	}
	if node == nil {
		return fmt.Errorf("no node at %s", address)
	}
	call := node.Name + " " + strings.TrimPrefix(req.GetStep().String(), "STEP_")
	a.mu.Lock()
	a.calls = append(a.calls, call)
	err = a.fail[call]
	a.mu.Unlock()
	if err != nil {
		return err
	}
	progress("did " + call)
	switch req.GetStep() {
	case upgradeagentv1.Step_STEP_APPLY:
		cm, _ := a.client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubeadm-config", metav1.GetOptions{})
		cm.Data["ClusterConfiguration"] = "kubernetesVersion: " + req.GetKubernetesVersion() + "\n"
		if _, err := a.client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		fallthrough
	case upgradeagentv1.Step_STEP_NODE:
		if _, ok := node.Labels[controlPlaneLabel]; ok {
			if _, err := a.client.CoreV1().Pods(metav1.NamespaceSystem).Update(ctx, staticPod("kube-apiserver", node.Name, req.GetKubernetesVersion()), metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
	case upgradeagentv1.Step_STEP_KUBELET:
		node.Status.NodeInfo.KubeletVersion = req.GetKubernetesVersion()
		if _, err := a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func (a *agents) called() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func release(t *testing.T, v string) versions.Release {
	t.Helper()
	r, err := versions.Resolve(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func rollOptions(client kubernetes.Interface, a *agents, switched *int, out *bytes.Buffer, to versions.Release) Options {
	return Options{
		Client: client, Agent: a, Release: to, Out: out, NodeTimeout: 30 * time.Second, DrainTimeout: 10 * time.Second,
		Components: func(string) ([]*componentsv1.Component, error) { return nil, nil },
		SwitchJoinConfig: func(context.Context) error {
			*switched++
			return nil
		},
	}
}

// TestRunOrder: control planes first (the first applies), then workers,
// each step in kubeadm's order; the join configuration switches right
// after the first control plane; every node ends uncordoned and marked.
func TestRunOrder(t *testing.T) {
	client := cluster(t, "v1.35.8", "worker-2", "cp-1", "worker-1", "cp-0")
	a := &agents{client: client}
	var switched int
	var out bytes.Buffer
	opts := rollOptions(client, a, &switched, &out, release(t, "1.36"))
	opts.SwitchJoinConfig = func(context.Context) error {
		switched++
		if got := a.called(); len(got) != 2 {
			t.Errorf("the join configuration switched after %v, want right after cp-0 moved", got)
		}
		return nil
	}
	if err := Run(t.Context(), opts); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	want := []string{"cp-0 APPLY", "cp-0 KUBELET", "cp-1 NODE", "cp-1 KUBELET", "worker-1 NODE", "worker-1 KUBELET", "worker-2 NODE", "worker-2 KUBELET"}
	if got := a.called(); !slices.Equal(got, want) {
		t.Errorf("agent calls %v, want %v", got, want)
	}
	if switched != 1 {
		t.Errorf("the join configuration switched %d times, want once", switched)
	}
	for _, n := range []string{"cp-0", "cp-1", "worker-1", "worker-2"} {
		node, _ := client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if node.Spec.Unschedulable || node.Annotations[annotationVersion] != "v1.36.4" || node.Annotations[annotationCordoned] != "" {
			t.Errorf("%s after the roll: unschedulable %t, annotations %v", n, node.Spec.Unschedulable, node.Annotations)
		}
	}
	if !strings.Contains(out.String(), "Every node runs Kubernetes v1.36.4") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestRunStopsAndResumes: a node that fails stops the roll there, cordoned;
// nothing after it is touched; the next run resumes at it.
func TestRunStopsAndResumes(t *testing.T) {
	client := cluster(t, "v1.35.8", "cp-0", "worker-1", "worker-2")
	a := &agents{client: client, fail: map[string]error{"worker-1 KUBELET": errors.New("the kubelet did not become healthy")}}
	var switched int
	var out bytes.Buffer
	err := Run(t.Context(), rollOptions(client, a, &switched, &out, release(t, "1.36")))
	if err == nil || !strings.Contains(err.Error(), "The roll stopped at worker-1") || !strings.Contains(err.Error(), "did not become healthy") {
		t.Fatalf("Run = %v, want the roll stopped at worker-1", err)
	}
	if got := a.called(); slices.Contains(got, "worker-2 NODE") {
		t.Errorf("the roll went on past the failed node: %v", got)
	}
	node, _ := client.CoreV1().Nodes().Get(t.Context(), "worker-1", metav1.GetOptions{})
	if !node.Spec.Unschedulable || node.Annotations[annotationCordoned] != "true" {
		t.Errorf("the failed node is not left cordoned: %v", node.Annotations)
	}
	delete(a.fail, "worker-1 KUBELET")
	a.calls = nil
	out.Reset()
	if err := Run(t.Context(), rollOptions(client, a, &switched, &out, release(t, "1.36"))); err != nil {
		t.Fatalf("the resumed run: %v\n%s", err, out.String())
	}
	want := []string{"worker-1 NODE", "worker-1 KUBELET", "worker-2 NODE", "worker-2 KUBELET"}
	if got := a.called(); !slices.Equal(got, want) {
		t.Errorf("the resumed run called %v, want %v", got, want)
	}
	if !strings.Contains(out.String(), "2 of 3 nodes to move") || switched != 2 {
		t.Errorf("resumed plan or join switch (%d):\n%s", switched, out.String())
	}
	node, _ = client.CoreV1().Nodes().Get(t.Context(), "worker-1", metav1.GetOptions{})
	if node.Spec.Unschedulable {
		t.Error("worker-1 is left cordoned after the resumed run")
	}
}

// TestRunRefusesBeforeChanging: versions the cluster may not move to,
// and a dry run, change nothing.
func TestRunRefusesBeforeChanging(t *testing.T) {
	tests := []struct {
		name, cluster, to, want string
		dryRun                  bool
	}{
		{"a skipped minor version", "v1.34.11", "1.36", "skips a minor version", false},
		{"a downgrade", "v1.36.4", "1.35", "cannot be downgraded", false},
		{"a dry run", "v1.35.8", "1.36", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := cluster(t, tt.cluster, "cp-0", "worker-1")
			a := &agents{client: client}
			var switched int
			var out bytes.Buffer
			opts := rollOptions(client, a, &switched, &out, release(t, tt.to))
			opts.DryRun = tt.dryRun
			err := Run(t.Context(), opts)
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Run = %v, want %q", err, tt.want)
			}
			if tt.dryRun && (err != nil || !strings.Contains(out.String(), "kubeadm upgrade apply v1.36.4")) {
				t.Fatalf("dry run: %v\n%s", err, out.String())
			}
			if len(a.called()) != 0 || switched != 0 {
				t.Errorf("agents called %v, join switched %d times", a.called(), switched)
			}
			for _, n := range []string{"cp-0", "worker-1"} {
				if node, _ := client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{}); node.Spec.Unschedulable {
					t.Errorf("%s was cordoned", n)
				}
			}
		})
	}
}

// TestRunKeepsOthersCordon: a node an administrator cordoned stays
// cordoned after the roll moved it.
func TestRunKeepsOthersCordon(t *testing.T) {
	client := cluster(t, "v1.35.8", "cp-0", "worker-1")
	node, _ := client.CoreV1().Nodes().Get(t.Context(), "worker-1", metav1.GetOptions{})
	node.Spec.Unschedulable = true
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var switched int
	var out bytes.Buffer
	if err := Run(t.Context(), rollOptions(client, &agents{client: client}, &switched, &out, release(t, "1.36"))); err != nil {
		t.Fatal(err)
	}
	if node, _ := client.CoreV1().Nodes().Get(t.Context(), "worker-1", metav1.GetOptions{}); !node.Spec.Unschedulable {
		t.Error("the roll uncordoned a node someone else had cordoned")
	}
}

// TestRunReplace: nodes running node software whose reference values are
// being replaced are not moved in place (their image holds the binaries
// and runs no upgrade agent): no agent call, not cordoned, named for
// replacement; a first control plane to replace leaves kubeadm upgrade
// apply to the next; when every control plane is to be replaced the roll
// is refused before anything changes.
func TestRunReplace(t *testing.T) {
	client := cluster(t, "v1.35.8", "cp-0", "cp-1", "worker-1", "worker-2")
	a := &agents{client: client}
	var switched int
	var out bytes.Buffer
	opts := rollOptions(client, a, &switched, &out, release(t, "1.36"))
	why := "it proves roles.worker.referenceValues, which the new values replace"
	opts.Replace = map[string]string{"cp-0": why, "worker-2": why}
	if err := Run(t.Context(), opts); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	want := []string{"cp-1 APPLY", "cp-1 KUBELET", "worker-1 NODE", "worker-1 KUBELET"}
	if got := a.called(); !slices.Equal(got, want) {
		t.Errorf("agent calls %v, want %v", got, want)
	}
	for _, n := range []string{"cp-0", "worker-2"} {
		node, _ := client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if node.Spec.Unschedulable || node.Annotations[annotationVersion] != "" {
			t.Errorf("%s, to replace, was touched: unschedulable %t, annotations %v", n, node.Spec.Unschedulable, node.Annotations)
		}
	}
	if !strings.Contains(out.String(), "to replace with the new node software: cp-0, worker-2") || !strings.Contains(out.String(), "not moved in place: "+why) {
		t.Errorf("output does not name the nodes to replace:\n%s", out.String())
	}

	client = cluster(t, "v1.35.8", "cp-0", "worker-1")
	a = &agents{client: client}
	out.Reset()
	opts = rollOptions(client, a, &switched, &out, release(t, "1.36"))
	opts.Replace = map[string]string{"cp-0": why}
	if err := Run(t.Context(), opts); err == nil || !strings.Contains(err.Error(), "replace the control planes before the roll") {
		t.Fatalf("Run with every control plane to replace = %v, want a refusal", err)
	}
	if got := a.called(); len(got) != 0 {
		t.Errorf("the refused roll called agents: %v", got)
	}
}
