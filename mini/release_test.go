package mini

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/charts"
)

func releaseServices(t *testing.T) *ReleaseServices {
	t.Helper()
	r := &ReleaseServices{Version: "v0.2.0", Images: map[string]v1.ImageIndex{}, Charts: map[string]*chart.Chart{}}
	for _, svc := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		idx, err := random.Index(64, 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		r.Images[svc] = idx
		r.Charts[svc] = &chart.Chart{Metadata: &chart.Metadata{Name: svc, Version: "0.2.0"}}
	}
	return r
}

// With a release, mini installs the release's chart running the release's
// image by digest from the cluster's registry; without, the CLI's chart.
func TestReleaseServicesChart(t *testing.T) {
	r := releaseServices(t)
	values := map[string]any{"image": map[string]any{"pullPolicy": "Never"}}
	c, err := r.chart("gatehouse-joinservice", values, "10.88.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	if c != r.Charts["gatehouse-joinservice"] {
		t.Errorf("chart %v, want the release's", c.Metadata)
	}
	d, _ := r.Images["gatehouse-joinservice"].Digest()
	want := map[string]any{"pullPolicy": "IfNotPresent", "repository": "10.88.0.1:5000/gatehouse-joinservice", "digest": d.String()}
	got := values["image"].(map[string]any)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("image.%s = %v, want %v", k, got[k], v)
		}
	}
	delete(r.Charts, "gatehouse-keyservice")
	if _, err := r.chart("gatehouse-keyservice", map[string]any{}, "10.88.0.1:5000"); err == nil {
		t.Error("a release without the key service's chart gave one")
	}
	var none *ReleaseServices
	c, err = none.chart("gatehouse-keyservice", map[string]any{}, "10.88.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := charts.Load("gatehouse-keyservice")
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != builtin.Metadata.Version || c.Metadata.Name != "gatehouse-keyservice" {
		t.Errorf("without a release: chart %v, want the CLI's", c.Metadata)
	}
}

// push writes each index to the real registry (CNCF distribution, the
// one the local cluster runs) with its digest kept: what the nodes pull by.
func TestReleaseServicesPush(t *testing.T) {
	addons := os.Getenv("GATEHOUSE_ADDON_BIN")
	if addons == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("GATEHOUSE_ADDON_BIN is not set: export GATEHOUSE_ADDON_BIN=$(hack/addon-binaries.sh)")
		}
		t.Skip("GATEHOUSE_ADDON_BIN is not set (hack/addon-binaries.sh builds the registry)")
	}
	registry := startTestRegistry(t, filepath.Join(addons, "registry"))
	r := releaseServices(t)
	if err := r.push(t.Context(), registry); err != nil {
		t.Fatal(err)
	}
	for svc, idx := range r.Images {
		want, _ := idx.Digest()
		ref, err := name.NewDigest(registry+"/"+svc+"@"+want.String(), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Index(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pulling %s by digest: %v", ref, err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: the registry serves %s", ref, d)
		}
	}
	var none *ReleaseServices
	if err := none.push(t.Context(), registry); err != nil {
		t.Errorf("pushing without a release: %v", err)
	}
}

// startTestRegistry runs the distribution registry on a free local port
// and returns its address once it answers.
func startTestRegistry(t *testing.T, bin string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "registry.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, filepath.Join(dir, "storage"), addr), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", cfg)
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/") //nolint:noctx // a local test registry
		if err == nil {
			resp.Body.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry did not answer at %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
