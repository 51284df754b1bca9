package basetemplate

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

const hash = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParse(t *testing.T) {
	good := func(extra string) string {
		return "kubernetesVersion: v1.40.1\narchitectures:\n  amd64:\n  - name: kubelet\n    url: https://m.example/kubelet\n    hash: " + hash + "\n    installPath: /usr/local/bin/kubelet\n" + extra
	}
	for _, tc := range []struct {
		name, data, err string
	}{
		{"valid", good(""), ""},
		{"another version's file", strings.Replace(good(""), "v1.40.1", "v1.40.2", 1), `kubernetesVersion is "v1.40.2", but the file is v1.40.1's`},
		{"unknown field", good("foo: bar\n"), "unknown field"},
		{"unknown architecture", good("  riscv64:\n  - name: x\n"), `architecture "riscv64"`},
		{"no architectures", "kubernetesVersion: v1.40.1\n", "architectures is empty"},
		{"repeated name", good("  - name: kubelet\n    url: https://m.example/k\n    hash: " + hash + "\n    installPath: /usr/bin/k\n"), `name "kubelet" is empty, repeated`},
		{"name with a slash", strings.Replace(good(""), "name: kubelet", "name: ../kubelet", 1), "not letters, digits"},
		{"file URL", strings.Replace(good(""), "https://m.example/kubelet", "file:///kubelet", 1), "is not http or https"},
		{"URL with a quote", strings.Replace(good(""), "https://m.example/kubelet", "https://m.example/k'$(reboot)'", 1), "must not contain quotes"},
		{"short hash", strings.Replace(good(""), hash, "sha256:abc", 1), "64 lowercase hex"},
		{"relative install path", strings.Replace(good(""), "/usr/local/bin/kubelet", "bin/kubelet", 1), "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.data), "v1.40.1")
			if tc.err == "" {
				if err != nil || len(f.Architectures["amd64"]) != 1 {
					t.Fatalf("Parse() = %+v, %v", f, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Parse() = %v, want an error containing %q", err, tc.err)
			}
		})
	}
}

// TestTable: the compiled table's URLs go through the mirror with their
// digests; an unknown version wraps render.ErrNoBaseTemplate.
func TestTable(t *testing.T) {
	release := versions.Default()
	official, err := release.Components("arm64")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Table{Mirror: &mirror.Mirror{Files: "https://m.example/f"}}.Components(t.Context(), release.Version, "arm64")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range got {
		if c.URL != "https://m.example/f/"+strings.TrimPrefix(official[i].URL, "https://") || c.Hash != official[i].Hash {
			t.Errorf("component %d = %+v, want %s through the mirror", i, c, official[i].URL)
		}
	}
	if _, err := (Table{}).Components(t.Context(), "v1.99.0", "amd64"); !errors.Is(err, render.ErrNoBaseTemplate) {
		t.Fatalf("an unknown version: %v, want ErrNoBaseTemplate", err)
	}
}

// TestBucket: templates in a real S3 bucket (MinIO): a version is
// supported exactly when its object exists, the error naming the object
// to add; a changed object is read again.
func TestBucket(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{})
	store, err := userdatastore.New(userdatastore.Config{Endpoint: m.Endpoint, Bucket: m.Bucket,
		AccessKeyID: m.AccessKeyID, SecretAccessKey: m.SecretAccessKey, RootCAs: m.RootCAs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBucket(store, "templates"); err == nil || !strings.Contains(err.Error(), "ending in /") {
		t.Fatalf("a prefix without a slash: %v", err)
	}
	b, err := NewBucket(store, "templates/")
	if err != nil {
		t.Fatal(err)
	}
	release := versions.Default()
	key := "templates/" + release.Version + "/" + FileName
	_, err = b.Components(t.Context(), strings.TrimPrefix(release.Version, "v"), "amd64")
	if !errors.Is(err, render.ErrNoBaseTemplate) || !strings.Contains(err.Error(), "s3://"+m.Bucket+"/"+key) || !strings.Contains(err.Error(), release.Version+" is not supported") {
		t.Fatalf("without the object: %v, want ErrNoBaseTemplate naming the version and s3://%s/%s", err, m.Bucket, key)
	}
	for _, files := range []string{"https://first.example", "https://second.example/x"} {
		f, err := FromTable(release, &mirror.Mirror{Files: files}, []string{"amd64", "arm64"})
		if err != nil {
			t.Fatal(err)
		}
		data, err := yaml.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Put(t.Context(), key, data); err != nil {
			t.Fatal(err)
		}
		got, err := b.Components(t.Context(), release.Version, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(got[0].URL, files+"/dl.k8s.io/") {
			t.Fatalf("with the object from %s: first component %+v", files, got[0])
		}
	}
	if err := store.Put(t.Context(), key, []byte("kubernetesVersion: v1.0.0\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Components(t.Context(), release.Version, "arm64"); !errors.Is(err, render.ErrNoBaseTemplate) || !strings.Contains(err.Error(), "v1.0.0") {
		t.Fatalf("a broken object: %v, want ErrNoBaseTemplate naming what is wrong", err)
	}
}
