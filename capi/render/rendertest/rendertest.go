// Package rendertest checks bootstrap data in tests: cloud-config with
// Debian's `cloud-init schema`, Ignition with coreos/ignition's parser and
// validator, and reads the files either format writes.
package rendertest

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ignv3 "github.com/coreos/ignition/v2/config/v3_5"
	ignv3types "github.com/coreos/ignition/v2/config/v3_5/types"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/components"
)

// InstanceData is the instance metadata CloudInitSchema renders Jinja
// cloud-config with (cloud-init's instance-data.json, reduced).
var InstanceData = []byte(`{"v1": {"local_hostname": "node-0", "instance_id": "i-0"}, "ds": {"meta_data": {"local_hostname": "node-0", "instance-id": "i-0"}}}`)

// jinjaHeader starts cloud-config that is a Jinja template.
const jinjaHeader = "## template: jinja\n"

// CloudInitSchema fails the test unless `cloud-init schema` accepts data;
// Jinja cloud-config is first rendered with InstanceData by `cloud-init
// devel render`, as cloud-init renders it at boot. It returns the
// document cloud-init reads (after Jinja).
func CloudInitSchema(t testing.TB, data []byte) []byte {
	t.Helper()
	if bytes.HasPrefix(data, []byte(jinjaHeader)) {
		data = RenderJinja(t, data, InstanceData)
	}
	f := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "cloud-init", "schema", "--config-file", f).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Valid cloud-config") {
		t.Fatalf("cloud-init schema: %v\n%s", err, out)
	}
	return data
}

// RenderJinja renders Jinja cloud-config with instance data (JSON of
// cloud-init's instance-data.json) by `cloud-init devel render`, as
// cloud-init does at boot, and fails the test when cloud-init cannot.
func RenderJinja(t testing.TB, data, instanceData []byte) []byte {
	t.Helper()
	dir := t.TempDir()
	ud, id := filepath.Join(dir, "user-data"), filepath.Join(dir, "instance-data.json")
	if err := os.WriteFile(ud, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(id, instanceData, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "cloud-init", "devel", "render", "--instance-data", id, ud)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cloud-init devel render: %v\n%s", err, stderr.Bytes())
	}
	return out
}

// Ignition parses data with Ignition's validator and fails the test on an
// error or a fatal report.
func Ignition(t testing.TB, data []byte) ignv3types.Config {
	t.Helper()
	cfg, report, err := ignv3.Parse(data)
	if err != nil || report.IsFatal() {
		t.Fatalf("Ignition validator: %v\n%s", err, report.String())
	}
	return cfg
}

// Files checks data (schema or validator) and returns the files it writes,
// path to content: decompressed, appends added to what the data writes
// before them (on a machine without the file).
func Files(t testing.TB, format bootstrapv1.Format, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	if format == bootstrapv1.FormatIgnition {
		cfg := Ignition(t, data)
		for _, f := range cfg.Storage.Files {
			var content []byte
			for _, res := range append([]ignv3types.Resource{f.Contents}, f.Append...) {
				if res.Source == nil {
					continue
				}
				b := dataURL(t, *res.Source)
				if res.Compression != nil && *res.Compression == "gzip" {
					b = gunzip(t, f.Path, b)
				}
				content = append(content, b...)
			}
			files[f.Path] = content
		}
		return files
	}
	data = CloudInitSchema(t, data)
	var cfg struct {
		WriteFiles []struct {
			Path, Content, Encoding string
			Append                  bool
		} `json:"write_files"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("parsing cloud-config: %v", err)
	}
	for _, f := range cfg.WriteFiles {
		content := []byte(f.Content)
		if slices.Contains([]string{"b64", "base64", "gz+b64", "gzip+base64"}, f.Encoding) {
			var err error
			if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				t.Fatalf("%s: %v", f.Path, err)
			}
		}
		if strings.HasPrefix(f.Encoding, "gz") {
			content = gunzip(t, f.Path, content)
		}
		if f.Append {
			content = append(files[f.Path], content...)
		}
		files[f.Path] = content
	}
	return files
}

func gunzip(t testing.TB, path string, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// Text is the data with every file's content appended, so both formats
// can be searched as text.
func Text(t testing.TB, format bootstrapv1.Format, data []byte) string {
	t.Helper()
	_, text := FilesAndText(t, format, data)
	return text
}

// FilesAndText is Files and Text, checking data once.
func FilesAndText(t testing.TB, format bootstrapv1.Format, data []byte) (map[string][]byte, string) {
	t.Helper()
	files := Files(t, format, data)
	var b strings.Builder
	b.Write(data)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		b.WriteString("\n== " + p + "\n")
		b.Write(files[p])
	}
	return files, b.String()
}

func dataURL(t testing.TB, src string) []byte {
	t.Helper()
	b, err := components.ParseDataURL(src)
	if err != nil {
		t.Fatalf("file source: %v", err)
	}
	return b
}
