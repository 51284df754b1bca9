package installer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

func hashOf(data []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(data)) }

func newInstaller() *Installer { return New(Options{Attempts: 3, Backoff: time.Millisecond}) }

// serve serves content at /c, answering the first failures requests with
// fail, and counts requests.
func serve(t *testing.T, content []byte, failures int, fail func(http.ResponseWriter)) (string, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if int(hits.Add(1)) <= failures {
			fail(w)
			return
		}
		_, _ = w.Write(content)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/c", &hits
}

// truncate sends a Content-Length for the whole content but only half of
// it, then drops the connection.
func truncate(content []byte) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(content[:len(content)/2])
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}
}

func status(code int) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) { w.WriteHeader(code) }
}

// assertOnly fails unless dir holds exactly the names given.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
}

func TestInstallBinary(t *testing.T) {
	content := bytes.Repeat([]byte("kubelet "), 10000)
	for _, tc := range []struct {
		name     string
		failures int
		fail     func(http.ResponseWriter)
		hits     int32
	}{
		{"first try", 0, nil, 1},
		{"truncated download retried", 1, truncate(content), 2},
		{"server error retried", 2, status(http.StatusServiceUnavailable), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, hits := serve(t, content, tc.failures, tc.fail)
			dir := t.TempDir()
			dest := filepath.Join(dir, "bin", "kubelet")
			err := newInstaller().Install(t.Context(), []*componentsv1.Component{{Url: url, Hash: hashOf(content), InstallPath: dest}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dest)
			if err != nil || !bytes.Equal(got, content) {
				t.Fatalf("installed file differs (%v)", err)
			}
			if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o755 {
				t.Fatalf("mode %v, want 0755", fi.Mode().Perm())
			}
			if hits.Load() != tc.hits {
				t.Fatalf("%d requests, want %d", hits.Load(), tc.hits)
			}
			assertOnly(t, filepath.Join(dir, "bin"), "kubelet")
		})
	}
}

// TestInstallFailuresLeaveNothing: a hash mismatch (not retried), a client
// error (not retried) and persistent truncation (retried, then given up)
// all fail clearly and leave no file behind, not even a partial one.
func TestInstallFailuresLeaveNothing(t *testing.T) {
	content := []byte("the real kubeadm")
	for _, tc := range []struct {
		name     string
		serve    []byte
		failures int
		fail     func(http.ResponseWriter)
		want     string
		hits     int32
	}{
		{"hash mismatch", []byte("a tampered kubeadm"), 0, nil, "does not match its pinned sha256", 1},
		{"not found", content, 9, status(http.StatusNotFound), "404", 1},
		{"always truncated", content, 9, truncate(bytes.Repeat(content, 1000)), "unexpected EOF", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, hits := serve(t, tc.serve, tc.failures, tc.fail)
			dir := t.TempDir()
			err := newInstaller().Install(t.Context(), []*componentsv1.Component{{Url: url, Hash: hashOf(content), InstallPath: filepath.Join(dir, "kubeadm")}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if tc.name == "hash mismatch" && !errors.Is(err, errHashMismatch) {
				t.Fatalf("error %v is not ErrHashMismatch", err)
			}
			if hits.Load() != tc.hits {
				t.Fatalf("%d requests, want %d", hits.Load(), tc.hits)
			}
			assertOnly(t, dir)
		})
	}
}

func TestInstallOfflineURLs(t *testing.T) {
	content := []byte("#!/bin/sh\necho crictl\n")
	src := filepath.Join(t.TempDir(), "crictl")
	if err := os.WriteFile(src, content, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	components := []*componentsv1.Component{
		{Url: "file://" + src, Hash: hashOf(content), InstallPath: filepath.Join(dir, "from-file")},
		{Url: "data:application/octet-stream;base64," + base64.StdEncoding.EncodeToString(content), Hash: hashOf(content), InstallPath: filepath.Join(dir, "from-data")},
		{Url: "data:,%23!%2Fbin%2Fsh%0Aecho%20crictl%0A", Hash: hashOf(content), InstallPath: filepath.Join(dir, "from-text")},
	}
	if err := newInstaller().Install(t.Context(), components); err != nil {
		t.Fatal(err)
	}
	for _, c := range components {
		if got, err := os.ReadFile(c.GetInstallPath()); err != nil || !bytes.Equal(got, content) {
			t.Errorf("%s: installed %q, %v", c.GetInstallPath(), got, err)
		}
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarGz(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o755, Size: int64(len(e.body))}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestInstallExtract(t *testing.T) {
	archive := tarGz(t, []entry{
		{name: "./", typ: tar.TypeDir},
		{name: "./bridge", typ: tar.TypeReg, body: "bridge plugin"},
		{name: "./loopback", typ: tar.TypeReg, body: "loopback plugin"},
		{name: "./sub/", typ: tar.TypeDir},
		{name: "./sub/x", typ: tar.TypeReg, body: "x"},
		{name: "./lo", typ: tar.TypeSymlink, link: "loopback"},
	})
	url, _ := serve(t, archive, 0, nil)
	dest := filepath.Join(t.TempDir(), "opt", "cni", "bin")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, "keep-me"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := newInstaller().Install(t.Context(), []*componentsv1.Component{{Url: url, Hash: hashOf(archive), InstallPath: dest, Extract: true}}); err != nil {
		t.Fatal(err)
	}
	assertOnly(t, dest, "bridge", "keep-me", "lo", "loopback", "sub")
	if got, _ := os.ReadFile(filepath.Join(dest, "lo")); string(got) != "loopback plugin" {
		t.Fatalf("symlink reads %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "sub", "x")); string(got) != "x" {
		t.Fatalf("sub/x reads %q", got)
	}
}

// TestExtractRefusesEscapes: archives with entries leaving the install
// directory are refused and install nothing, not even their good entries.
func TestExtractRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]entry{
		"dot-dot":          {{name: "good", typ: tar.TypeReg, body: "g"}, {name: "../evil", typ: tar.TypeReg, body: "e"}},
		"absolute":         {{name: "good", typ: tar.TypeReg, body: "g"}, {name: "/etc/evil", typ: tar.TypeReg, body: "e"}},
		"symlink out":      {{name: "good", typ: tar.TypeReg, body: "g"}, {name: "evil", typ: tar.TypeSymlink, link: "../../etc/passwd"}},
		"absolute symlink": {{name: "evil", typ: tar.TypeSymlink, link: "/etc/passwd"}},
		"device":           {{name: "good", typ: tar.TypeReg, body: "g"}, {name: "dev", typ: tar.TypeChar}},
		"write via link":   {{name: "sub", typ: tar.TypeSymlink, link: "."}, {name: "sub/../../evil", typ: tar.TypeReg, body: "e"}},
	} {
		t.Run(name, func(t *testing.T) {
			archive := tarGz(t, entries)
			url, _ := serve(t, archive, 0, nil)
			parent := t.TempDir()
			dest := filepath.Join(parent, "bin")
			err := newInstaller().Install(t.Context(), []*componentsv1.Component{{Url: url, Hash: hashOf(archive), InstallPath: dest, Extract: true}})
			if err == nil {
				t.Fatal("an escaping archive was installed")
			}
			assertOnly(t, dest)
			assertOnly(t, parent, "bin")
		})
	}
}

// TestInstallValidatesFirst: Install validates every component before
// downloading anything.
func TestInstallValidatesFirst(t *testing.T) {
	dir := t.TempDir()
	err := newInstaller().Install(t.Context(), []*componentsv1.Component{
		{Url: "data:,a", Hash: hashOf([]byte("a")), InstallPath: filepath.Join(dir, "a")},
		{Url: "gopher://x", Hash: hashOf([]byte("b")), InstallPath: filepath.Join(dir, "b")},
	})
	if err == nil {
		t.Fatal("Install accepted an invalid component")
	}
	assertOnly(t, dir)
}

// TestInstallSameBinaryOnce: kubelet, kubeadm and kubectl from one
// multi-call binary (the same digest, at one URL or several) are fetched
// and checked once and installed under each name.
func TestInstallSameBinaryOnce(t *testing.T) {
	content := bytes.Repeat([]byte("kube "), 10000)
	url, hits := serve(t, content, 0, nil)
	dir := filepath.Join(t.TempDir(), "bin")
	var list []*componentsv1.Component
	for _, name := range []string{"kubelet", "kubeadm", "kubectl"} {
		// A mirror's paths of the official names: one file at three URLs.
		list = append(list, &componentsv1.Component{Url: url + "/" + name, Hash: hashOf(content), InstallPath: filepath.Join(dir, name)})
	}
	if err := newInstaller().Install(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	if hits.Load() != 1 {
		t.Fatalf("%d requests, want 1", hits.Load())
	}
	for _, c := range list {
		got, err := os.ReadFile(c.GetInstallPath())
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("%s differs (%v)", c.GetInstallPath(), err)
		}
		if fi, _ := os.Stat(c.GetInstallPath()); fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s has mode %v, want 0755", c.GetInstallPath(), fi.Mode().Perm())
		}
	}
	assertOnly(t, dir, "kubeadm", "kubectl", "kubelet")
}

// TestInstallKeepsBakedBinaries: binaries already at their install paths
// with the pinned digest (the node image's, links to one multi-call binary
// in a read-only directory) are neither fetched nor written; one that
// differs is replaced.
func TestInstallKeepsBakedBinaries(t *testing.T) {
	content := bytes.Repeat([]byte("kube "), 1000)
	url, hits := serve(t, content, 0, nil)
	dir := filepath.Join(t.TempDir(), "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kube"), content, 0o755); err != nil {
		t.Fatal(err)
	}
	var list []*componentsv1.Component
	for _, name := range []string{"kubelet", "kubeadm"} {
		if err := os.Symlink("kube", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		list = append(list, &componentsv1.Component{Url: url, Hash: hashOf(content), InstallPath: filepath.Join(dir, name)})
	}
	if err := newInstaller().Install(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	if hits.Load() != 0 {
		t.Fatalf("%d requests for binaries already installed, want 0", hits.Load())
	}
	for _, c := range list {
		if fi, err := os.Lstat(c.GetInstallPath()); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("%s was replaced (%v)", c.GetInstallPath(), err)
		}
	}

	if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	other := &componentsv1.Component{Url: url, Hash: hashOf(content), InstallPath: filepath.Join(dir, "kubectl")}
	if err := newInstaller().Install(t.Context(), []*componentsv1.Component{other}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(other.GetInstallPath()); err != nil || !bytes.Equal(got, content) || hits.Load() != 1 {
		t.Fatalf("a binary with another digest was not replaced (%v, %d requests)", err, hits.Load())
	}
}

// TestHoldsOnceHashesEachFileOnce: the names of one multi-call binary are
// links to one file, which is hashed once per Install (the second name's
// check does not read the file again: here its bytes changed in between
// and it still counts as confirmed); a file with other bytes, or a digest
// not confirmed, is hashed.
func TestHoldsOnceHashesEachFileOnce(t *testing.T) {
	dir := t.TempDir()
	content := []byte("kube multi-call binary")
	real := filepath.Join(dir, "kube")
	if err := os.WriteFile(real, content, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kubelet", "kubeadm"} {
		if err := os.Symlink("kube", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("other"), 0o755); err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	if !holdsOnce(held, filepath.Join(dir, "kubelet"), hashOf(content)) {
		t.Fatal("the first name of the binary does not hold its digest")
	}
	if err := os.WriteFile(real, []byte("changed"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !holdsOnce(held, filepath.Join(dir, "kubeadm"), hashOf(content)) {
		t.Error("the second name of the same file was hashed again")
	}
	if holdsOnce(held, other, hashOf(content)) {
		t.Error("another file holds the digest by the cache")
	}
	if holdsOnce(held, filepath.Join(dir, "kubelet"), hashOf([]byte("never"))) {
		t.Error("a digest never confirmed counts as held")
	}
	if !holdsOnce(held, filepath.Join(dir, "kubelet"), hashOf([]byte("changed"))) {
		t.Error("the file's new bytes, hashed for another digest, do not hold it")
	}
	if holdsOnce(held, filepath.Join(dir, "missing"), hashOf(content)) {
		t.Error("a missing file holds a digest")
	}
}
