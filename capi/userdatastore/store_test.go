package userdatastore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// testSecret is distinctive so a leak into any message is found.
const testSecret = "s3cr3t-DO-NOT-LEAK-0123456789abcdef"

func validConfig() Config {
	return Config{
		Endpoint: "127.0.0.1:9000", Bucket: "gatehouse-test", Region: "us-east-1",
		AccessKeyID: "gatehouse", SecretAccessKey: testSecret,
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   error
	}{
		{"valid configuration", func(*Config) {}, nil},
		{"valid without region, with CA pool", func(c *Config) { c.Region, c.RootCAs = "", x509.NewCertPool() }, nil},
		{"plain HTTP with SSE", func(c *Config) { c.Insecure, c.ServerSideEncryption = true, true }, nil},
		{"empty endpoint is refused", func(c *Config) { c.Endpoint = "" }, errInvalidConfig},
		{"endpoint with scheme is refused", func(c *Config) { c.Endpoint = "https://s3.example.com" }, errInvalidConfig},
		{"endpoint with path is refused", func(c *Config) { c.Endpoint = "s3.example.com/bucket" }, errInvalidConfig},
		{"endpoint with bad port is refused", func(c *Config) { c.Endpoint = "s3.example.com:notaport" }, errInvalidConfig},
		{"empty bucket is refused", func(c *Config) { c.Bucket = "" }, errInvalidConfig},
		{"bucket with upper case is refused", func(c *Config) { c.Bucket = "Gatehouse" }, errInvalidConfig},
		{"bucket with slash is refused", func(c *Config) { c.Bucket = "a/b" }, errInvalidConfig},
		{"missing access key ID is refused", func(c *Config) { c.AccessKeyID = "" }, errInvalidConfig},
		{"missing secret is refused", func(c *Config) { c.SecretAccessKey = "" }, errInvalidConfig},
		{"short secret is refused", func(c *Config) { c.SecretAccessKey = "1234567" }, errInvalidConfig},
		{"secret of the minimum length", func(c *Config) { c.SecretAccessKey = "12345678" }, nil},
		{"CA pool with plain HTTP is refused", func(c *Config) { c.Insecure, c.RootCAs = true, x509.NewCertPool() }, errInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig()
			tt.modify(&cfg)
			s, err := New(cfg)
			if !errors.Is(err, tt.want) {
				t.Fatalf("New() error = %v, want %v", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), testSecret) {
				t.Fatalf("New() error contains the secret: %v", err)
			}
			if err == nil && s == nil {
				t.Fatal("New() returned neither a store nor an error")
			}
		})
	}
}

func TestConfigNeverShowsTheSecret(t *testing.T) {
	cfg := validConfig()
	var log strings.Builder
	slog.New(slog.NewTextHandler(&log, nil)).Info("Store", "config", cfg)
	for name, s := range map[string]string{
		"%v":   fmt.Sprintf("%v", cfg),
		"%+v":  fmt.Sprintf("%+v", cfg),
		"%#v":  fmt.Sprintf("%#v", cfg),
		"*%v":  fmt.Sprintf("%v", &cfg),
		"slog": log.String(),
	} {
		if strings.Contains(s, testSecret) {
			t.Errorf("%s shows the secret: %s", name, s)
		}
		if !strings.Contains(s, cfg.Bucket) {
			t.Errorf("%s does not show the bucket: %s", name, s)
		}
	}
}

func TestObjectKey(t *testing.T) {
	const uid = types.UID("0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	if got, want := ObjectKey("team-a", "worker-0", uid), "gatehouse/bootstrap-data/team-a/worker-0-"+string(uid); got != want {
		t.Fatalf("ObjectKey() = %q, want %q", got, want)
	}
	// Inputs that must all map to distinct keys.
	inputs := []struct {
		namespace, name string
		uid             types.UID
	}{
		{"team-a", "worker-0", uid},
		{"team-a", "worker-0", "6f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"},
		{"team-b", "worker-0", uid},
		{"team-a", "worker-1", uid},
		{"a/b", "c", uid},
		{"a", "b/c", uid},
		{"a%2Fb", "c", uid},
	}
	seen := map[string]int{}
	for i, in := range inputs {
		key := ObjectKey(in.namespace, in.name, in.uid)
		if !strings.HasPrefix(key, keyPrefix) {
			t.Errorf("ObjectKey(%q, %q, %q) = %q lacks the prefix %q", in.namespace, in.name, in.uid, key, keyPrefix)
		}
		if strings.Count(key, "/") != strings.Count(keyPrefix, "/")+1 {
			t.Errorf("ObjectKey(%q, %q, %q) = %q: a part added a path segment", in.namespace, in.name, in.uid, key)
		}
		if j, ok := seen[key]; ok {
			t.Errorf("inputs %d and %d share the key %q", j, i, key)
		}
		seen[key] = i
	}
}

func TestPresignedGetURLBounds(t *testing.T) {
	tests := []struct {
		name     string
		insecure bool
		key      string
		ttl      time.Duration
		want     error
		expires  string // X-Amz-Expires, seconds
	}{
		{"zero TTL is refused", false, "k", 0, errTTLOutOfRange, ""},
		{"negative TTL is refused", false, "k", -time.Hour, errTTLOutOfRange, ""},
		{"sub-second TTL is refused", false, "k", 999 * time.Millisecond, errTTLOutOfRange, ""},
		{"one second is the minimum", false, "k", time.Second, nil, "1"},
		{"fractions of a second are truncated", false, "k", 90*time.Second + 500*time.Millisecond, nil, "90"},
		{"seven days is the maximum", false, "k", 7 * 24 * time.Hour, nil, "604800"},
		{"over seven days is refused", false, "k", 7*24*time.Hour + time.Second, errTTLOutOfRange, ""},
		{"empty key is refused", false, "", time.Hour, errEmptyKey, ""},
		{"plain HTTP store presigns http", true, "k", time.Hour, nil, "3600"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig() // with a region: presigning makes no request
			cfg.Insecure = tt.insecure
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			u, err := s.PresignedGetURL(context.Background(), tt.key, tt.ttl)
			if !errors.Is(err, tt.want) {
				t.Fatalf("PresignedGetURL() error = %v, want %v", err, tt.want)
			}
			if err != nil {
				return
			}
			wantScheme := "https"
			if tt.insecure {
				wantScheme = "http"
			}
			if u.Scheme != wantScheme || u.Host != cfg.Endpoint {
				t.Errorf("PresignedGetURL() = %s://%s, want %s://%s", u.Scheme, u.Host, wantScheme, cfg.Endpoint)
			}
			if got := u.Query().Get("X-Amz-Expires"); got != tt.expires {
				t.Errorf("X-Amz-Expires = %q, want %q", got, tt.expires)
			}
			if strings.Contains(u.String(), testSecret) {
				t.Errorf("the URL contains the secret")
			}
		})
	}
}

func TestPutAndDeleteRefuseBadArguments(t *testing.T) {
	s, err := New(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"put with empty key", func() error { return s.Put(ctx, "", []byte("x")) }, errEmptyKey},
		{"put of nil data", func() error { return s.Put(ctx, "k", nil) }, errNilData},
		{"delete with empty key", func() error { return s.Delete(ctx, "") }, errEmptyKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestS3URI(t *testing.T) {
	s, err := New(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	key := ObjectKey("team-a", "worker-0", "0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31")
	if got, want := s.S3URI(key), "s3://gatehouse-test/gatehouse/bootstrap-data/team-a/worker-0-0d5c7a4e-3b9f-4b8e-9a1c-2f6e8d7b5a31"; got != want {
		t.Fatalf("S3URI() = %q, want %q", got, want)
	}
}

func TestRedact(t *testing.T) {
	leaky := fmt.Errorf("%w: signing with %s failed", errAccessDenied, testSecret)
	tests := []struct {
		name     string
		err      error
		wantMsg  string
		sentinel error
	}{
		{"nil stays nil", nil, "", nil},
		{"an error without the secret is kept", ErrBucketNotFound, ErrBucketNotFound.Error(), ErrBucketNotFound},
		{"the secret is replaced, the sentinel kept", leaky, "access denied: signing with [REDACTED] failed", errAccessDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := redact(tt.err, testSecret)
			if tt.err == nil {
				if got != nil {
					t.Fatalf("redact(nil) = %v", got)
				}
				return
			}
			if got.Error() != tt.wantMsg {
				t.Errorf("redact() = %q, want %q", got.Error(), tt.wantMsg)
			}
			if !errors.Is(got, tt.sentinel) {
				t.Errorf("redact() = %v does not match %v", got, tt.sentinel)
			}
			for e := got; e != nil; e = errors.Unwrap(e) {
				if strings.Contains(e.Error(), testSecret) {
					t.Errorf("the chain still holds the secret: %v", e)
				}
			}
		})
	}
}
