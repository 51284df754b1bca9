package testenv

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ClusterAPICRDs returns the CRD directories of the pinned
// sigs.k8s.io/cluster-api module (go.mod): its core types (Cluster,
// Machine, ...) and its kubeadm bootstrap provider (upstream CABPK).
func ClusterAPICRDs(t testing.TB) (core, kubeadmBootstrap string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api").Output()
	if err != nil {
		t.Fatalf("locating the sigs.k8s.io/cluster-api module (go list -m): %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatal("the sigs.k8s.io/cluster-api module is not downloaded: run go mod download")
	}
	return filepath.Join(dir, "core", "config", "crd", "bases"), filepath.Join(dir, "bootstrap", "kubeadm", "config", "crd", "bases")
}
