package images

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCache: the archive is built once and found again while nothing
// that goes into it changes; a changed binary, link, reference, entrypoint
// or architecture is another key and another build; a killed build leaves
// no archive under a key's name, and its leftovers go once stale; only
// the most recently used archives stay.
func TestCache(t *testing.T) {
	bin := t.TempDir()
	kube := filepath.Join(bin, "kube")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(kube, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("#!/bin/sh\necho kube 1\n")
	specs := func() []Spec {
		return []Spec{{Ref: "docker.io/local/kube-apiserver:v1.36.4", Files: map[string]string{"kube": kube}, Links: map[string]string{"kube-apiserver": "kube"}}}
	}
	c := Cache{Dir: filepath.Join(t.TempDir(), "cache"), Keep: 2}

	built, err := c.Archive("amd64", specs())
	if err != nil || built.Hit {
		t.Fatalf("first build: %+v, %v", built, err)
	}
	first := built.Path
	firstDigest, err := FileDigest(first)
	if err != nil || built.Digest != firstDigest {
		t.Fatalf("the archive's digest is %s (%v), Archive says %s", firstDigest, err, built.Digest)
	}
	again, err := c.Archive("amd64", specs())
	if err != nil || again != (Cached{Path: first, Digest: firstDigest, Hit: true}) {
		t.Fatalf("same inputs: %+v, %v; want %s from the cache", again, err, first)
	}
	// A lost digest file is made again.
	if err := os.Remove(first + ".sha256"); err != nil {
		t.Fatal(err)
	}
	if again, err := c.Archive("amd64", specs()); err != nil || again.Digest != firstDigest {
		t.Fatalf("without its digest file: %+v, %v", again, err)
	}

	// Every input is part of the key.
	key, err := cacheKey("amd64", specs())
	if err != nil {
		t.Fatal(err)
	}
	changes := map[string]func() (string, []Spec){
		"architecture": func() (string, []Spec) { return "arm64", specs() },
		"reference": func() (string, []Spec) {
			s := specs()
			s[0].Ref = "docker.io/local/kube-apiserver:v1.36.5"
			return "amd64", s
		},
		"link": func() (string, []Spec) {
			s := specs()
			s[0].Links = map[string]string{"kube-scheduler": "kube"}
			return "amd64", s
		},
		"entrypoint": func() (string, []Spec) {
			s := specs()
			s[0].Entrypoint = []string{BinDir + "/kube"}
			return "amd64", s
		},
		"file name": func() (string, []Spec) {
			s := specs()
			s[0].Files = map[string]string{"kube2": kube}
			s[0].Links = map[string]string{"kube-apiserver": "kube2"}
			return "amd64", s
		},
	}
	for what, change := range changes {
		arch, s := change()
		if k, err := cacheKey(arch, s); err != nil || k == key {
			t.Errorf("a changed %s keeps the key (%v)", what, err)
		}
	}

	// A changed binary (same path, same size) is another archive.
	write("#!/bin/sh\necho kube 2\n")
	rebuilt, err := c.Archive("amd64", specs())
	if err != nil || rebuilt.Hit || rebuilt.Path == first {
		t.Fatalf("changed binary: %+v, %v; want a new build", rebuilt, err)
	}
	second := rebuilt.Path
	if d, _ := FileDigest(first); d != firstDigest {
		t.Fatal("a new build changed the first archive")
	}

	// A failed build leaves nothing under its key's name.
	bad := specs()
	bad[0].Links = map[string]string{"kube-apiserver": "missing"}
	if _, err := c.Archive("amd64", bad); err == nil {
		t.Fatal("a dangling link was accepted")
	}
	if k, err := cacheKey("amd64", bad); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(filepath.Join(c.Dir, k+".tar")); !os.IsNotExist(err) {
		t.Fatalf("a failed build left an archive under its key: %v", err)
	}

	// A killed build: its temporary archive and scratch directory never
	// carry a key's name; stale ones are removed by the next build.
	stale := time.Now().Add(-2 * staleAfter)
	leftovers := []string{filepath.Join(c.Dir, ".0123.tar.tmp-1"), filepath.Join(c.Dir, ".layers-1")}
	fresh := filepath.Join(c.Dir, ".layers-2") // a build in progress
	for _, p := range append(leftovers, fresh) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range leftovers {
		if err := os.Chtimes(p, stale, stale); err != nil {
			t.Fatal(err)
		}
	}
	// Mark the first archive as the least recently used; what is kept
	// beside it (a containerd seed) goes with it.
	if err := os.Chtimes(first, stale, stale); err != nil {
		t.Fatal(err)
	}
	beside := strings.TrimSuffix(first, ".tar") + ".containerd"
	if err := os.MkdirAll(filepath.Join(beside, "content"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("#!/bin/sh\necho kube 3\n")
	latest, err := c.Archive("amd64", specs())
	if err != nil {
		t.Fatal(err)
	}
	third := latest.Path
	for _, p := range leftovers {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the stale leftover %s stays", p)
		}
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a build in progress lost its file: %v", err)
	}
	// Keep 2: the least recently used of three goes.
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var archives []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tar") && !strings.HasPrefix(e.Name(), ".") {
			archives = append(archives, filepath.Join(c.Dir, e.Name()))
		}
	}
	if len(archives) != 2 || !slices.Contains(archives, second) || !slices.Contains(archives, third) {
		t.Fatalf("cache holds %v; want the two most recently used %s and %s", archives, second, third)
	}
	for _, p := range []string{first + ".sha256", beside} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s, kept beside the removed archive, stays: %v", p, err)
		}
	}
}
