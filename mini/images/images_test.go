package images

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	kube := filepath.Join(dir, "kube")
	if err := os.WriteFile(kube, []byte("#!/bin/sh\necho kube\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	specs := []Spec{
		{Ref: "docker.io/local/kube-apiserver:v1.36.4", Files: map[string]string{"kube": kube}, Links: map[string]string{"kube-apiserver": "kube"}},
		{Ref: "docker.io/local/pause:3.10.2", Files: map[string]string{"pause": kube}, Entrypoint: []string{BinDir + "/pause"}},
	}
	archive := filepath.Join(dir, "images.tar")
	if err := WriteArchive(archive, "amd64", specs); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("docker.io/local/kube-apiserver:v1.36.4")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != "amd64" || cfg.OS != "linux" || !slices.Contains(cfg.Config.Env, "PATH=/usr/local/bin:/usr/bin:/bin") {
		t.Fatalf("config %+v", cfg)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers %d, %v: want the binaries and the links", len(layers), err)
	}
	entries := map[string]string{}
	for _, layer := range layers {
		rc, err := layer.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries[h.Name] = h.Linkname
		}
		_ = rc.Close()
	}
	if _, ok := entries["usr/local/bin/kube"]; !ok || entries["usr/local/bin/kube-apiserver"] != "kube" {
		t.Fatalf("layer entries %v", entries)
	}

	// The same inputs give the same image.
	again, err := newLayers(t.TempDir()).Build(specs[0], "amd64")
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Fatalf("digests differ: %s, %s", d1, d2)
	}

	pauseTag, _ := name.NewTag("docker.io/local/pause:3.10.2")
	pause, err := tarball.ImageFromPath(archive, &pauseTag)
	if err != nil {
		t.Fatal(err)
	}
	pcfg, _ := pause.ConfigFile()
	if !slices.Equal(pcfg.Config.Entrypoint, []string{"/usr/local/bin/pause"}) {
		t.Fatalf("pause entrypoint %v", pcfg.Config.Entrypoint)
	}

	bad := []Spec{{Ref: "docker.io/local/x:1", Files: map[string]string{"a": kube}, Links: map[string]string{"b": "missing"}}}
	if err := WriteArchive(filepath.Join(dir, "bad.tar"), "amd64", bad); err == nil {
		t.Fatal("a dangling link was accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.tar")); !os.IsNotExist(err) {
		t.Fatal("a failed archive was left behind")
	}
}

// TestDirsCarryTheirLibraries: a directory of plugins (Debian's iptables
// extensions, which the kube-proxy image carries) is copied with the
// libraries the plugins load (libxt_statistic.so needs libm): without
// them kube-proxy cannot program Services.
func TestDirsCarryTheirLibraries(t *testing.T) {
	const ext = "/usr/lib/x86_64-linux-gnu/xtables"
	plugin := filepath.Join(ext, "libxt_statistic.so")
	if _, err := os.Stat(plugin); err != nil {
		t.Fatalf("%v: apt-get install iptables (make setup does)", err)
	}
	deps, err := sharedLibraries(plugin)
	if err != nil || len(deps) == 0 {
		t.Fatalf("libraries of %s: %v %v", plugin, deps, err)
	}
	img, err := newLayers(t.TempDir()).Build(Spec{Ref: "docker.io/local/kube-proxy:v1.36.4",
		Files: map[string]string{"xtables-nft-multi": "/usr/sbin/xtables-nft-multi"}, Dirs: []string{ext}}, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]bool{}
	for _, layer := range layers {
		rc, err := layer.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries["/"+h.Name] = true
		}
		_ = rc.Close()
	}
	for _, want := range append([]string{plugin, filepath.Join(ext, "libxt_MASQUERADE.so")}, deps...) {
		if !entries[want] {
			t.Errorf("the image lacks %s", want)
		}
	}
}

// TestLayersShared: an image's binaries are a layer each, so kube-proxy's
// image shares the Kubernetes binary's layer with kube-apiserver's (an
// archive holds it once; a node imports and unpacks it once).
func TestLayersShared(t *testing.T) {
	dir := t.TempDir()
	kube, other := filepath.Join(dir, "kube"), filepath.Join(dir, "other")
	for _, f := range []string{kube, other} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\necho "+f+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	layers := newLayers(t.TempDir())
	apiserver, err := layers.Build(Spec{Ref: "docker.io/local/kube-apiserver:v1", Files: map[string]string{"kube": kube}, Links: map[string]string{"kube-apiserver": "kube"}}, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := layers.Build(Spec{Ref: "docker.io/local/kube-proxy:v1", Files: map[string]string{"kube": kube, "other": other}, Links: map[string]string{"kube-proxy": "kube"}}, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	a, err := apiserver.Layers()
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 2 || len(p) != 3 {
		t.Fatalf("%d and %d layers; want a layer per binary and the links", len(a), len(p))
	}
	da, _ := a[0].Digest()
	dp, _ := p[0].Digest()
	if da != dp {
		t.Fatalf("kube-proxy's first layer %s is not kube-apiserver's %s", dp, da)
	}
}
