package testenv

import (
	"fmt"
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
	cfg, stop, err := startEnvtest(crdDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return cfg
}

// startEnvtest starts envtest; the caller stops it.
func startEnvtest(crdDirs ...string) (cfg *rest.Config, stop func() error, err error) {
	dir, err := BinDir()
	if err != nil {
		return nil, nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	if cfg, err = env.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting envtest: %w", err)
	}
	return cfg, env.Stop, nil
}
