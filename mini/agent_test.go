package mini

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/utils/ptr"
)

// TestKubeadmKubeletFlags: the kubelet starts only once kubeadm wrote both
// its configuration and its flags whole, in either order (kubeadm join
// writes the configuration first, kubeadm init the flags first).
func TestKubeadmKubeletFlags(t *testing.T) {
	const whole = `KUBELET_KUBEADM_ARGS="--hostname-override=worker-1 --node-ip=10.88.1.13 --register-with-taints=a=b:NoSchedule"` + "\n"
	want := []string{"--hostname-override=worker-1", "--node-ip=10.88.1.13", "--register-with-taints=a=b:NoSchedule"}
	for _, tc := range []struct {
		name   string
		config bool
		flags  *string
		want   []string
	}{
		{name: "nothing written"},
		{name: "configuration only (kubeadm join, before its flags)", config: true},
		{name: "flags only (kubeadm init, before its configuration)", flags: ptr.To(whole)},
		{name: "flags file created, empty", config: true, flags: ptr.To("")},
		{name: "flags cut inside the value", config: true, flags: ptr.To(whole[:40])},
		{name: "flags without the line break", config: true, flags: ptr.To(whole[:len(whole)-1])},
		{name: "whole", config: true, flags: ptr.To(whole), want: want},
		{name: "whole, after a comment", config: true, flags: ptr.To("# written by kubeadm\n" + whole), want: want},
		{name: "no flags", config: true, flags: ptr.To("KUBELET_KUBEADM_ARGS=\"\"\n"), want: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config, flags := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeadm-flags.env")
			if tc.config {
				if err := os.WriteFile(config, []byte("kind: KubeletConfiguration\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.flags != nil {
				if err := os.WriteFile(flags, []byte(*tc.flags), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := kubeadmKubeletFlags(config, flags)
			if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
				t.Fatalf("kubeadmKubeletFlags = %q, %v; want %q, %v", got, ok, tc.want, tc.want != nil)
			}
		})
	}
}
