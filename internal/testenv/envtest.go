package testenv

import (
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// NewEnvtest starts a controller-runtime envtest environment (etcd and
// kube-apiserver) from the pinned binaries, installing the CRDs found in
// crdDirs, and stops it when the test ends. It is for controller tests that
// want envtest's conveniences; tests that need kube-controller-manager or the
// files of a kubeadm-style PKI use New.
func NewEnvtest(t testing.TB, crdDirs ...string) *rest.Config {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return cfg
}
