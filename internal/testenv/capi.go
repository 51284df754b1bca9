package testenv

import (
	"context"
	"errors"
	"fmt"
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
	core, kubeadmBootstrap, err := ClusterAPICRDDirs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return core, kubeadmBootstrap
}

// ClusterAPICRDDirs is ClusterAPICRDs for a TestMain.
func ClusterAPICRDDirs(ctx context.Context) (core, kubeadmBootstrap string, err error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api").Output()
	if err != nil {
		return "", "", fmt.Errorf("locating the sigs.k8s.io/cluster-api module (go list -m): %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", "", errors.New("the sigs.k8s.io/cluster-api module is not downloaded: run go mod download")
	}
	return filepath.Join(dir, "core", "config", "crd", "bases"), filepath.Join(dir, "bootstrap", "kubeadm", "config", "crd", "bases"), nil
}
