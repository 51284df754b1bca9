package cli

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestControlPlaneArch: the join configuration's components are for the
// first control plane's architecture; amd64 when no control plane says.
func TestControlPlaneArch(t *testing.T) {
	node := func(name, arch string, controlPlane bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{Architecture: arch}}}
		if controlPlane {
			n.Labels["node-role.kubernetes.io/control-plane"] = ""
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  string
	}{
		{"the first control plane's", []*corev1.Node{node("a-worker", "amd64", false), node("cp-1", "amd64", true), node("cp-0", "arm64", true)}, "arm64"},
		{"none reports one", []*corev1.Node{node("cp-0", "", true)}, "amd64"},
		{"no control plane", nil, "amd64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, n := range tc.nodes {
				if _, err := client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			got, err := controlPlaneArch(t.Context(), client)
			if err != nil || got != tc.want {
				t.Fatalf("controlPlaneArch = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
