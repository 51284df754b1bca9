package mini

import (
	"bytes"
	"testing"
	"time"
)

// TestBootManifestHook: the caller's hook decides what each node measures;
// Up applies it to a copy, so the cluster's reference value stays.
func TestBootManifestHook(t *testing.T) {
	reference := bootManifest("v1.36.4", "0123")
	base := nodeBase{images: &nodeImages{manifest: bytes.Clone(reference)}}
	u := &up{opts: Options{
		Dir: t.TempDir(),
		BootManifest: func(node string, m []byte) []byte {
			if node == "worker-2" {
				m[0] ^= 1
			}
			return m
		},
	}}
	tests := []struct {
		node      string
		unchanged bool
	}{
		{"cp-0", true},
		{"worker-1", true},
		{"worker-2", false},
	}
	for i, tt := range tests {
		spec := u.newSpec(base, i, tt.node)
		if got := bytes.Equal(spec.BootManifest, reference); got != tt.unchanged {
			t.Errorf("%s measures the reference manifest: %v, want %v", tt.node, got, tt.unchanged)
		}
	}
	if !bytes.Equal(base.images.manifest, reference) {
		t.Fatal("the hook changed the cluster's reference manifest")
	}
	u.opts.BootManifest = nil
	if spec := u.newSpec(base, 3, "worker-3"); !bytes.Equal(spec.BootManifest, reference) {
		t.Fatal("without a hook a node does not measure the reference manifest")
	}
}

// TestServicesWaitLongerForVMs: a cluster with VM nodes waits for nodes
// and add-ons as long as TCG emulation needs; one of namespace nodes as
// long as before.
func TestServicesWaitLongerForVMs(t *testing.T) {
	for _, tt := range []struct {
		vms        bool
		base, want time.Duration
	}{
		{false, 3 * time.Minute, 3 * time.Minute},
		{true, 3 * time.Minute, vmWait},
		{true, time.Hour, time.Hour},
	} {
		if got := (&services{vms: tt.vms}).wait(tt.base); got != tt.want {
			t.Errorf("vms %t: wait(%s) = %s, want %s", tt.vms, tt.base, got, tt.want)
		}
	}
}
