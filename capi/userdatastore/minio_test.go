package userdatastore

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// minioConfig is the configuration of a store on m's bucket; no region, so
// presigning asks the server for the bucket's location.
func minioConfig(m *testenv.MinIO) Config {
	return Config{
		Endpoint: m.Endpoint, Bucket: m.Bucket,
		AccessKeyID: m.AccessKeyID, SecretAccessKey: m.SecretAccessKey,
		RootCAs: m.RootCAs,
	}
}

func newStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(): %v", err)
	}
	return s
}

// answer is what a GET got.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// get fetches u the way a machine does: a plain HTTP client that only
// trusts the test CA.
func get(t *testing.T, pool *x509.CertPool, u *url.URL) answer {
	t.Helper()
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET of the presigned URL: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the presigned GET: %v", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}
}

// statSSE returns the object's x-amz-server-side-encryption header, read
// with the root credentials.
func statSSE(t *testing.T, m *testenv.MinIO, key string) string {
	t.Helper()
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(m.AccessKeyID, m.SecretAccessKey, ""),
		Secure:    true,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: m.RootCAs, MinVersion: tls.VersionTLS12}},
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := client.StatObject(t.Context(), m.Bucket, key, minio.StatObjectOptions{})
	if err != nil {
		t.Fatalf("StatObject(%s): %v", key, err)
	}
	return info.Metadata.Get("X-Amz-Server-Side-Encryption")
}

// bootstrapData is larger than a cloud's user-data limit (EC2: 16 KiB) and
// not text.
func bootstrapData() []byte {
	data := bytes.Repeat([]byte("#cloud-config\x00\xff\n"), 8192)
	return data[:100000]
}

func TestPutThenPresignedGet(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{SSE: true})
	tests := []struct {
		name    string
		sse     bool
		data    []byte
		wantSSE string
	}{
		{"large binary data with SSE-S3", true, bootstrapData(), "AES256"},
		{"small data without SSE", false, []byte("#cloud-config\n"), ""},
		{"empty data", true, []byte{}, "AES256"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := minioConfig(m)
			cfg.ServerSideEncryption = tt.sse
			s := newStore(t, cfg)
			key := ObjectKey("default", "worker", types.UID(strings.Repeat(string(rune('a'+i)), 36)))
			if err := s.Put(t.Context(), key, tt.data); err != nil {
				t.Fatalf("Put(): %v", err)
			}
			u, err := s.PresignedGetURL(t.Context(), key, time.Minute)
			if err != nil {
				t.Fatalf("PresignedGetURL(): %v", err)
			}
			if u.Scheme != "https" {
				t.Fatalf("the presigned URL is %s, want https", u.Scheme)
			}
			got := get(t, m.RootCAs, u)
			if got.status != http.StatusOK {
				t.Fatalf("presigned GET: %d: %s", got.status, got.body)
			}
			if !bytes.Equal(got.body, tt.data) {
				t.Fatalf("presigned GET returned %d bytes that differ from the %d put", len(got.body), len(tt.data))
			}
			if got := got.header.Get("Content-Type"); got != contentType {
				t.Errorf("Content-Type = %q, want %q", got, contentType)
			}
			if got := statSSE(t, m, key); got != tt.wantSSE {
				t.Errorf("x-amz-server-side-encryption = %q, want %q", got, tt.wantSSE)
			}
		})
	}
}

func TestPutReplaces(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{})
	s := newStore(t, minioConfig(m))
	key := ObjectKey("default", "worker", "0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	for _, data := range []string{"first", "second"} {
		if err := s.Put(t.Context(), key, []byte(data)); err != nil {
			t.Fatalf("Put(%q): %v", data, err)
		}
	}
	u, err := s.PresignedGetURL(t.Context(), key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, m.RootCAs, u); string(got.body) != "second" {
		t.Fatalf("after two Puts the object is %q, want %q", got.body, "second")
	}
}

func TestDelete(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{})
	s := newStore(t, minioConfig(m))
	key := ObjectKey("default", "worker", "0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	if err := s.Put(t.Context(), key, []byte("data")); err != nil {
		t.Fatal(err)
	}
	u, err := s.PresignedGetURL(t.Context(), key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second Delete finds nothing and succeeds
		if err := s.Delete(t.Context(), key); err != nil {
			t.Fatalf("Delete() #%d: %v", i+1, err)
		}
	}
	if got := get(t, m.RootCAs, u); got.status != http.StatusNotFound || !strings.Contains(string(got.body), "<Code>NoSuchKey</Code>") {
		t.Fatalf("presigned GET after Delete: %d: %s; want 404 NoSuchKey", got.status, got.body)
	}
	if err := s.Delete(t.Context(), ObjectKey("default", "never-put", "6f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0")); err != nil {
		t.Fatalf("Delete() of an object never put: %v", err)
	}
}

func TestErrorsAgainstMinIO(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{})
	const key = "gatehouse/bootstrap-data/default/worker-0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31"
	ops := map[string]func(*Store) error{
		"Put":    func(s *Store) error { return s.Put(t.Context(), key, []byte("data")) },
		"Delete": func(s *Store) error { return s.Delete(t.Context(), key) },
	}
	tests := []struct {
		name       string
		modify     func(*Config)
		want       error
		wantInText string
	}{
		{"wrong secret", func(c *Config) { c.SecretAccessKey = testSecret }, errAccessDenied, ""},
		{"unknown access key", func(c *Config) { c.AccessKeyID, c.SecretAccessKey = "nobody", testSecret }, errAccessDenied, ""},
		{"missing bucket", func(c *Config) { c.Bucket = "no-such-bucket" }, ErrBucketNotFound, `"no-such-bucket"`},
	}
	for _, tt := range tests {
		for op, call := range ops {
			t.Run(tt.name+"/"+op, func(t *testing.T) {
				cfg := minioConfig(m)
				tt.modify(&cfg)
				err := call(newStore(t, cfg))
				if !errors.Is(err, tt.want) {
					t.Fatalf("%s() error = %v, want %v", op, err, tt.want)
				}
				for _, secret := range []string{cfg.SecretAccessKey, m.SecretAccessKey} {
					if strings.Contains(err.Error(), secret) {
						t.Fatalf("%s() error contains a secret: %v", op, err)
					}
				}
				if !strings.Contains(err.Error(), tt.wantInText) {
					t.Fatalf("%s() error %q does not name %s", op, err, tt.wantInText)
				}
			})
		}
	}
}

func TestPresignedURLExpires(t *testing.T) {
	m := testenv.StartMinIO(t, testenv.MinIOOptions{})
	s := newStore(t, minioConfig(m))
	key := ObjectKey("default", "worker", "0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	if err := s.Put(t.Context(), key, []byte("data")); err != nil {
		t.Fatal(err)
	}
	u, err := s.PresignedGetURL(t.Context(), key, minTTL)
	if err != nil {
		t.Fatal(err)
	}
	// Poll until the server refuses the URL; it must within a few seconds.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		got := get(t, m.RootCAs, u)
		if got.status == http.StatusForbidden && strings.Contains(string(got.body), "<Code>AccessDenied</Code>") {
			return
		}
		if got.status != http.StatusOK {
			t.Fatalf("presigned GET: %d: %s; want 200 and then 403 AccessDenied", got.status, got.body)
		}
		select {
		case <-ctx.Done():
			t.Fatal("a presigned URL with a TTL of 1s still works after 15s")
		case <-ticker.C:
		}
	}
}
