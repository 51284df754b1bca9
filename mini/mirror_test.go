package mini

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// TestMirrorComponents: the local build is laid out at the versions
// table's mirror paths, the components name the mirror's URLs with the
// build's digest, and ServeMirror serves the build's bytes there.
func TestMirrorComponents(t *testing.T) {
	kubeBin, dir := t.TempDir(), t.TempDir()
	kube := []byte("the local multi-call kube binary")
	if err := os.WriteFile(filepath.Join(kubeBin, "kube"), kube, 0o755); err != nil {
		t.Fatal(err)
	}
	release := versions.Default()
	nw := Network(3)
	list, err := mirrorComponents(dir, nw, release.Version, kubeBin)
	if err != nil {
		t.Fatal(err)
	}
	hash := fmt.Sprintf("sha256:%x", sha256.Sum256(kube))
	if len(list) != 3 {
		t.Fatalf("%d components, want kubelet, kubeadm and kubectl", len(list))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	done := make(chan error, 1)
	go func() { done <- ServeMirror(t.Context(), mirrorFilesDir(dir), addr) }()
	t.Cleanup(func() {
		// The test's context ends before its cleanups: the server stops.
		if err := <-done; err != nil {
			t.Errorf("ServeMirror: %v", err)
		}
	})
	for _, c := range list {
		name := filepath.Base(c.GetInstallPath())
		want := "http://10.88.3.1:5080/dl.k8s.io/release/" + release.Version + "/bin/linux/amd64/" + name
		if c.GetUrl() != want || c.GetHash() != hash {
			t.Errorf("component %s = %v, want %s with the build's digest %s", name, c, want, hash)
		}
		local := "http://" + addr + strings.TrimPrefix(c.GetUrl(), nw.mirrorURL())
		var got []byte
		err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, local, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false, nil //nolint:nilerr // the server is starting
			}
			defer resp.Body.Close()
			got, err = io.ReadAll(resp.Body)
			return resp.StatusCode == http.StatusOK, err
		})
		if err != nil || string(got) != string(kube) {
			t.Errorf("the mirror serves %q at %s (%v), want the build", got, local, err)
		}
	}
	// A second cluster start lays the links out again.
	if _, err := mirrorComponents(dir, nw, release.Version, kubeBin); err != nil {
		t.Fatalf("laying out the mirror again: %v", err)
	}
}
