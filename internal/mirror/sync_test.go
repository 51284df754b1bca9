package mirror

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// upstream routes every request to srv, as if srv were each URL's host
// (the official hosts are out of reach of a test).
type upstream struct{ srv *httptest.Server }

func (u upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	target, _ := url.Parse(u.srv.URL)
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host = target.Scheme, target.Host
	r.URL.Path = "/" + req.URL.Host + req.URL.Path
	return http.DefaultTransport.RoundTrip(r)
}

func TestPath(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", "dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", ""},
		{"https://h.example/a/../../etc/passwd", "", "not a clean file path"},
		{"https://h.example/dir/", "", "not a clean file path"},
		{"file:///x", "", "only http(s)"},
	} {
		got, err := Path(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Path(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Path(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestFiles: every component of both architectures, once each (the CNI
// plugins of one architecture are one file).
func TestFiles(t *testing.T) {
	release := versions.Default()
	files, err := Files(release, []string{"amd64", "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	amd, _ := release.Components("amd64")
	arm, _ := release.Components("arm64")
	if len(files) != len(amd)+len(arm) {
		t.Fatalf("%d files, want %d", len(files), len(amd)+len(arm))
	}
	if _, err := Files(release, []string{"riscv64"}); err == nil {
		t.Fatal("an unknown architecture gave no error")
	}
}

// TestSyncFiles: files land at their mirror paths with their digests; a
// second sync keeps them; an upstream serving a changed file is refused
// naming the URL and both digests, and leaves nothing behind.
func TestSyncFiles(t *testing.T) {
	content := map[string][]byte{
		"/dl.k8s.io/release/v9/bin/linux/amd64/kubelet": []byte("kubelet"),
		"/github.com/x/releases/download/v1/cni.tgz":    []byte("cni archive"),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, ok := content[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: upstream{srv}}
	files := []File{
		{URL: "https://dl.k8s.io/release/v9/bin/linux/amd64/kubelet", Hash: hashOf([]byte("kubelet"))},
		{URL: "https://github.com/x/releases/download/v1/cni.tgz", Hash: hashOf([]byte("cni archive"))},
	}
	dir := t.TempDir()
	var out bytes.Buffer
	if err := SyncFiles(t.Context(), client, dir, files, &out); err != nil {
		t.Fatal(err)
	}
	for p, data := range content {
		if got, err := os.ReadFile(filepath.Join(dir, p)); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s holds %q (%v)", p, got, err)
		}
	}
	out.Reset()
	if err := SyncFiles(t.Context(), client, dir, files, &out); err != nil || strings.Count(out.String(), ": present") != 2 {
		t.Fatalf("second sync: %v\n%s", err, out.String())
	}

	content["/github.com/x/releases/download/v1/cni.tgz"] = []byte("a changed archive")
	fresh := t.TempDir()
	err := SyncFiles(t.Context(), client, fresh, files, io.Discard)
	if !errors.Is(err, errDigestMismatch) || !strings.Contains(err.Error(), files[1].URL) || !strings.Contains(err.Error(), "pinned "+files[1].Hash) ||
		!strings.Contains(err.Error(), "received "+hashOf([]byte("a changed archive"))) {
		t.Fatalf("a changed file: %v, want errDigestMismatch naming the URL and both digests", err)
	}
	entries, _ := os.ReadDir(filepath.Join(fresh, "github.com/x/releases/download/v1"))
	if len(entries) != 0 {
		t.Fatalf("a refused download left %v", entries)
	}
}

func hashOf(data []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(data)) }

// TestCopyImage: an image copied from one real registry (CNCF
// distribution) to another lands at its mirror name with the same digest,
// by tag and by digest; a reference pinning another digest is refused.
func TestCopyImage(t *testing.T) {
	src, dst := testenv.StartRegistry(t), testenv.StartRegistry(t)
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(src+"/k8s/pause:3.10", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	m := &Mirror{Registry: dst + "/mirror"}
	wantRepo := dst + "/mirror/" + strings.ReplaceAll(src, ":", "_") + "/k8s/pause"
	for _, in := range []string{src + "/k8s/pause:3.10", src + "/k8s/pause@" + digest.String()} {
		got, err := m.CopyImage(t.Context(), in)
		if err != nil {
			t.Fatal(err)
		}
		if got != wantRepo+"@"+digest.String() {
			t.Fatalf("CopyImage(%s) = %s, want %s@%s", in, got, wantRepo, digest)
		}
		back, err := name.ParseReference(got, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		pulled, err := remote.Image(back)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := pulled.Digest(); d != digest {
			t.Fatalf("the mirror serves %s, want %s", d, digest)
		}
	}
	other, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	otherDigest, _ := other.Digest()
	if _, err := m.CopyImage(t.Context(), src+"/k8s/pause:3.10@"+otherDigest.String()); err == nil {
		t.Fatal("a reference pinning a digest the registry does not serve was copied")
	}
}
