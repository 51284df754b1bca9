package release

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
)

// smallRelease builds a release of the repository's charts and
// clusterctl files whose three images all run gatehouse-pause (a small
// static binary): what verification checks, in seconds.
func smallRelease(t *testing.T, dir string, signer *cosignformat.Signer) *Manifest {
	t.Helper()
	node := t.TempDir()
	for name, data := range map[string]string{"manifest.json": "{}\n", "node-worker.raw": "disk"} {
		if err := os.WriteFile(filepath.Join(node, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := Build(context.Background(), Config{
		Version: "v0.1.0", Commit: "0123456789abcdef0123456789abcdef01234567", RepoDir: "../..", OutDir: dir,
		Registry: "ghcr.io/gatehouse-dev", Arches: []string{runtime.GOARCH},
		Commands: []Command{{Name: "gatehouse-pause", Package: "./cmd/gatehouse-pause"}},
		Images: []ImageSpec{{Name: "gatehouse-capi-bootstrap", Command: "gatehouse-pause"},
			{Name: "gatehouse-joinservice", Command: "gatehouse-pause"}, {Name: "gatehouse-keyservice", Command: "gatehouse-pause"}},
		Charts:          []ChartSpec{{Name: "gatehouse-joinservice", Image: "gatehouse-joinservice"}, {Name: "gatehouse-keyservice", Image: "gatehouse-keyservice"}},
		ClusterctlImage: "gatehouse-capi-bootstrap", NodeImageDir: node, Signer: signer,
		Epoch: time.Unix(1700000000, 0).UTC(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func keys(t *testing.T) (*cosignformat.Signer, *cosignformat.Verifier) {
	t.Helper()
	priv, pub, err := cosignformat.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := cosignformat.LoadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cosignformat.LoadVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		return copyFile(p, filepath.Join(dst, rel))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, file string, at int64) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if at < 0 {
		at += int64(len(data))
	}
	data[at] ^= 0x01
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rewriteArchive extracts an image archive, lets change edit the layout
// directory, and tars it back in place (SHA256SUMS then no longer
// matches: the inner checks are exercised with verifyImageArchive).
func rewriteArchive(t *testing.T, file string, change func(dir string)) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := untar(f, dir); err != nil {
		t.Fatal(err)
	}
	f.Close()
	change(dir)
	out, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarDir(dir, out, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	out.Close()
}

// blobOf returns the path of the blob of the index's first platform's
// manifest (what) in an extracted layout: "manifest" or "layer".
func blobOf(t *testing.T, dir string, m Image, what string) string {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := v1.NewHash(m.Digest)
	inner, err := idx.ImageIndex(want)
	if err != nil {
		t.Fatal(err)
	}
	im, err := inner.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	d := im.Manifests[0].Digest
	if what == "layer" {
		img, err := inner.Image(d)
		if err != nil {
			t.Fatal(err)
		}
		mf, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		d = mf.Layers[0].Digest
	}
	return filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
}

func TestVerify(t *testing.T) {
	signer, verifier := keys(t)
	otherSigner, otherVerifier := keys(t)
	built := filepath.Join(t.TempDir(), "release")
	m := smallRelease(t, built, signer)
	join, _ := m.Image("gatehouse-joinservice")
	chart := m.Charts[0].Path
	bin := m.Binaries[0].Path
	tests := []struct {
		name string
		// tamper changes the copy of the release in dir.
		tamper func(t *testing.T, dir string)
		v      *cosignformat.Verifier
		// wantIn is what the refusal names; "" for none.
		wantIn string
	}{
		{name: "the release as built verifies", tamper: func(*testing.T, string) {}},
		{name: "changed binary", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, bin), 100) },
			wantIn: bin + ": sha256"},
		{name: "changed chart", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, chart), -10) },
			wantIn: chart + ": sha256"},
		{name: "changed SBOM", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, bin+sbomSuffix), 20) },
			wantIn: bin + sbomSuffix + ": sha256"},
		{name: "changed image archive", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, join.Path), -2000) },
			wantIn: join.Path + ": sha256"},
		{name: "changed node image", tamper: func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, nodeImageDir, "node-worker.raw"), 0)
		}, wantIn: "node-image/node-worker.raw: sha256"},
		{name: "changed clusterctl file", tamper: func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, clusterctlDir, clusterctlComponents), -30)
		}, wantIn: "clusterctl/bootstrap-components.yaml: sha256"},
		{name: "changed release.json", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, manifestFile), 5) },
			wantIn: manifestFile + ": sha256"},
		{name: "SHA256SUMS changed to match a changed binary", tamper: func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, bin), 100)
			files, _ := listFiles(dir)
			sums, _ := checksums(dir, files)
			if err := os.WriteFile(filepath.Join(dir, checksumsFile), sums, 0o644); err != nil {
				t.Fatal(err)
			}
		}, wantIn: checksumsFile + ": " + "signature does not verify"},
		{name: "changed signature", tamper: func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, chart+".sig"), 3) },
			wantIn: chart + ": " + "signature does not verify"},
		{name: "unsigned artifact", tamper: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, chart+".sig")) },
			wantIn: chart + ": unsigned"},
		{name: "unsigned SHA256SUMS", tamper: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, checksumsFile+".sig")) },
			wantIn: checksumsFile + ": unsigned"},
		{name: "a file SHA256SUMS does not list", tamper: func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "bin", "extra"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, wantIn: "bin/extra: not listed"},
		{name: "everything re-signed with another key", tamper: func(t *testing.T, dir string) {
			files, _ := listFiles(dir)
			for _, f := range append(files, checksumsFile) {
				if err := signFile(otherSigner, filepath.Join(dir, f)); err != nil {
					t.Fatal(err)
				}
			}
		}, wantIn: checksumsFile + ": " + "signature does not verify"},
		{name: "wrong key", tamper: func(*testing.T, string) {}, v: otherVerifier,
			wantIn: checksumsFile + ": " + "signature does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "release")
			copyTree(t, built, dir)
			tt.tamper(t, dir)
			v := verifier
			if tt.v != nil {
				v = tt.v
			}
			scratch := t.TempDir()
			got, err := Verify(context.Background(), dir, v, scratch)
			if tt.wantIn == "" {
				if err != nil {
					t.Fatalf("Verify = %v", err)
				}
				if len(got.Images) != len(m.Images) || got.Manifest.Version != "v0.1.0" {
					t.Fatalf("Verify returned %+v", got)
				}
				return
			}
			if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), tt.wantIn) {
				t.Fatalf("Verify = %v, want a refusal naming %q", err, tt.wantIn)
			}
			if got != nil {
				t.Errorf("Verify returned a release with its refusal: %+v", got)
			}
		})
	}
}

// The checks inside an image archive, which a consumer given the archive
// alone (and a digest it trusts) relies on.
func TestVerifyImageArchive(t *testing.T) {
	signer, verifier := keys(t)
	otherSigner, _ := keys(t)
	built := filepath.Join(t.TempDir(), "release")
	m := smallRelease(t, built, signer)
	img, _ := m.Image("gatehouse-joinservice")
	want, _ := v1.NewHash(img.Digest)
	tests := []struct {
		name   string
		change func(t *testing.T, dir string)
		wantIn string
	}{
		{name: "the archive as built verifies", change: func(*testing.T, string) {}},
		{name: "changed layer", change: func(t *testing.T, dir string) { flipByte(t, blobOf(t, dir, img, "layer"), 50) },
			wantIn: "blobs do not match their digests"},
		{name: "changed manifest", change: func(t *testing.T, dir string) { flipByte(t, blobOf(t, dir, img, "manifest"), 10) },
			wantIn: "blobs do not match their digests"},
		{name: "index.json pointing at another index", change: func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, "index.json"))
			other := strings.Replace(string(data), want.Hex, strings.Repeat("0", 64), 1)
			if err := os.WriteFile(filepath.Join(dir, "index.json"), []byte(other), 0o644); err != nil {
				t.Fatal(err)
			}
		}, wantIn: "no image index " + img.Digest},
		{name: "unsigned image", change: func(t *testing.T, dir string) {
			p, _ := layout.FromPath(dir)
			if err := p.RemoveDescriptors(func(d v1.Descriptor) bool {
				return strings.HasSuffix(d.Annotations[refNameAnnotation], ".sig")
			}); err != nil {
				t.Fatal(err)
			}
		}, wantIn: "unsigned: no signature sha256-" + want.Hex + ".sig"},
		{name: "image signed by another key", change: func(t *testing.T, dir string) {
			p, _ := layout.FromPath(dir)
			if err := p.RemoveDescriptors(func(d v1.Descriptor) bool {
				return strings.HasSuffix(d.Annotations[refNameAnnotation], ".sig")
			}); err != nil {
				t.Fatal(err)
			}
			idx, _ := p.ImageIndex()
			inner, _ := idx.ImageIndex(want)
			digests, _ := signedDigests(inner)
			for _, d := range digests {
				sig, err := otherSigner.SignImage(img.Repository, d)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.AppendImage(sig, layout.WithAnnotations(map[string]string{refNameAnnotation: cosignformat.SignatureTag(d)})); err != nil {
					t.Fatal(err)
				}
			}
		}, wantIn: "no valid signature for the image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			archive := filepath.Join(t.TempDir(), "image.oci.tar")
			if err := copyFile(filepath.Join(built, img.Path), archive); err != nil {
				t.Fatal(err)
			}
			rewriteArchive(t, archive, func(dir string) { tt.change(t, dir) })
			got, err := verifyImageArchive(context.Background(), archive, t.TempDir(), img.Repository, want, verifier)
			if tt.wantIn == "" {
				if err != nil || got == nil {
					t.Fatalf("verifyImageArchive = %v", err)
				}
				return
			}
			if !errors.Is(err, errImage) || !strings.Contains(err.Error(), tt.wantIn) || !strings.Contains(err.Error(), archive) {
				t.Fatalf("verifyImageArchive = %v, want a refusal naming %s and %q", err, archive, tt.wantIn)
			}
		})
	}
}

// Every SBOM is CycloneDX JSON whose bom-refs are unique (the
// specification's rule) and whose subject carries the artifact's sha256.
func TestSBOMs(t *testing.T) {
	signer, _ := keys(t)
	dir := filepath.Join(t.TempDir(), "release")
	smallRelease(t, dir, signer)
	files, err := listFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if !strings.HasSuffix(f, sbomSuffix) {
			continue
		}
		n++
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		var bom cdx.BOM
		if err := json.Unmarshal(data, &bom); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if bom.SpecVersion != cdx.SpecVersion1_6 || bom.Metadata == nil || bom.Metadata.Component == nil || bom.Metadata.Component.Hashes == nil {
			t.Errorf("%s: spec %v, metadata %+v", f, bom.SpecVersion, bom.Metadata)
			continue
		}
		artifact := strings.TrimSuffix(f, sbomSuffix)
		if sum, err := fileSHA256(filepath.Join(dir, artifact)); err == nil && !strings.HasPrefix(artifact, imagesDir) {
			if got := (*bom.Metadata.Component.Hashes)[0].Value; got != sum {
				t.Errorf("%s: subject sha256 %s, the artifact's is %s", f, got, sum)
			}
		}
		refs := map[string]bool{}
		var walk func(cs *[]cdx.Component)
		walk = func(cs *[]cdx.Component) {
			if cs == nil {
				return
			}
			for _, c := range *cs {
				if c.BOMRef != "" {
					if refs[c.BOMRef] {
						t.Errorf("%s: bom-ref %s twice", f, c.BOMRef)
					}
					refs[c.BOMRef] = true
				}
				walk(c.Components)
			}
		}
		walk(&[]cdx.Component{*bom.Metadata.Component})
		walk(bom.Components)
		if bom.Components == nil || len(*bom.Components) == 0 {
			t.Errorf("%s lists no components", f)
		}
	}
	if n < 8 {
		t.Errorf("%d SBOMs, want one per binary, image, chart, the clusterctl files and the node image", n)
	}
}
