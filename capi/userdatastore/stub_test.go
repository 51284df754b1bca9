package userdatastore

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	ignition "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

func TestCloudConfigStub(t *testing.T) {
	presigned, err := url.Parse("https://s3.example.com/b/gatehouse/bootstrap-data/ns/n-u?X-Amz-Signature=ab%2Fc&X-Amz-Expires=3600")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		url  *url.URL
		want string
	}{
		{"presigned URL", presigned,
			"#include\nhttps://s3.example.com/b/gatehouse/bootstrap-data/ns/n-u?X-Amz-Signature=ab%2Fc&X-Amz-Expires=3600\n"},
		// url.Parse refuses control characters, a hand-built URL may carry them.
		{"a line break in the query stays on one line", &url.URL{Scheme: "https", Host: "s3.example.com", Path: "/k", RawQuery: "a=b\r\n#cloud-config"},
			"#include\nhttps://s3.example.com/k?a=b%0D%0A#cloud-config\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(CloudConfigStub(tt.url)); got != tt.want {
				t.Fatalf("CloudConfigStub() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestIgnitionStub(t *testing.T) {
	tests := []struct {
		name    string
		source  string
		wantErr string
	}{
		{"presigned https URL", "https://s3.example.com/b/k?X-Amz-Signature=abc&X-Amz-Expires=3600", ""},
		{"s3 URI", "s3://gatehouse-test/gatehouse/bootstrap-data/ns/n-u", ""},
		{"empty source is refused", "", "empty source"},
		{"relative source is refused", "gatehouse/bootstrap-data/ns/n-u", "not an absolute URL"},
		{"unsupported scheme is refused by the validator", "ftp://example.com/k?X-Amz-Signature=abc", "invalid"},
		{"s3 URI with an empty versionId is refused by the validator", "s3://b/k?versionId=", "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := IgnitionStub(tt.source, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("IgnitionStub() error = %v, want one containing %q", err, tt.wantErr)
				}
				if tt.source != "" && strings.Contains(err.Error(), "X-Amz-Signature") {
					t.Fatalf("IgnitionStub() error quotes the source: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("IgnitionStub(): %v", err)
			}
			cfg, report, err := ignition.Parse(out)
			if err != nil || report.IsFatal() {
				t.Fatalf("Ignition's parser refuses the stub: %v %s", err, report.String())
			}
			// Nothing but the version and the replace directive.
			want := types.Config{Ignition: types.Ignition{
				Version: ignitionVersion,
				Config:  types.IgnitionConfig{Replace: types.Resource{Source: &tt.source}},
			}}
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("IgnitionStub() parses to %+v, want %+v", cfg, want)
			}
		})
	}
}

// TestCloudInitFetchesTheStub has Debian's cloud-init process the stub
// (its UserDataProcessor, which fetches #include URLs when cloud-init
// consumes user data at boot) against a presigned URL of a real MinIO.
func TestCloudInitFetchesTheStub(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{SSE: true})
	cfg := minioConfig(m)
	cfg.ServerSideEncryption = true
	s := newStore(t, cfg)
	full := []byte("#cloud-config\nwrite_files:\n- path: /run/gatehouse/marker\n  content: " + strings.Repeat("x", 40000) + "\n")
	key := ObjectKey("default", "worker", "0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	if err := s.Put(t.Context(), key, full); err != nil {
		t.Fatal(err)
	}
	u, err := s.PresignedGetURL(t.Context(), key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parts := cloudInitProcess(t, CloudConfigStub(u), m.CACertPath)
	if len(parts) != 1 || parts[0].contentType != "text/cloud-config" || !bytes.Equal(parts[0].payload, full) {
		t.Fatalf("cloud-init made %d parts of the stub, want one text/cloud-config part with the %d bytes put", len(parts), len(full))
	}
}

type part struct {
	contentType string
	payload     []byte
}

// processScript runs cloud-init's user-data processor on the file argv[2]
// with argv[1] as cloud_dir and prints each resulting part as a line
// "<content type> <length>" followed by the payload.
const processScript = `import sys
from cloudinit import helpers, user_data
paths = helpers.Paths({"cloud_dir": sys.argv[1], "run_dir": sys.argv[1] + "/run"})
msg = user_data.UserDataProcessor(paths).process(open(sys.argv[2], "rb").read())
for p in msg.walk():
    if p.get_content_maintype() == "multipart":
        continue
    data = p.get_payload(decode=True)
    sys.stdout.buffer.write(b"%s %d\n" % (p.get_content_type().encode(), len(data)) + data)
`

// cloudInitProcess returns the parts cloud-init makes of userData, with
// Python's requests trusting caPath for HTTPS.
func cloudInitProcess(t *testing.T, userData []byte, caPath string) []part {
	t.Helper()
	python := cloudInitPython(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "user-data")
	if err := os.WriteFile(in, userData, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), python, "-c", processScript, filepath.Join(dir, "cloud"), in)
	cmd.Env = append(os.Environ(), "REQUESTS_CA_BUNDLE="+caPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cloud-init's user-data processor: %v\n%s", err, stderr.String())
	}
	var parts []part
	r := bufio.NewReader(bytes.NewReader(out))
	for {
		header, err := r.ReadString('\n')
		if header == "" && err != nil {
			return parts
		}
		var p part
		var n int
		if _, err := fmt.Sscan(header, &p.contentType, &n); err != nil {
			t.Fatalf("parsing %q: %v", header, err)
		}
		p.payload = make([]byte, n)
		if _, err := io.ReadFull(r, p.payload); err != nil {
			t.Fatalf("reading a part of %d bytes: %v", n, err)
		}
		parts = append(parts, p)
	}
}

// cloudInitPython returns the Python interpreter of Debian's cloud-init
// (from its entry script's #! line: the cloudinit module lives in that
// Python's dist-packages, which another python3 on PATH may not see).
func cloudInitPython(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatal("cloud-init is not installed (Debian package cloud-init; make setup installs it)")
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	python, ok := strings.CutPrefix(string(line), "#!")
	if !ok {
		t.Fatalf("%s has no #! line", bin)
	}
	return strings.Fields(python)[0]
}
