package testenv

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMinIOBin(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "minio-exe")
	notExe := filepath.Join(dir, "minio-not-exe")
	cache := filepath.Join(dir, "cache")
	cached := filepath.Join(cache, "tools", "bin", "minio")
	if err := os.MkdirAll(filepath.Dir(cached), 0o700); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{exe: 0o700, notExe: 0o600, cached: 0o700} {
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		env     string // GATEHOUSE_MINIO_BIN
		cache   string // GATEHOUSE_CACHE
		want    string
		wantErr string
	}{
		{name: "the environment variable wins", env: exe, cache: cache, want: exe},
		{name: "a non-executable file named by the variable is refused", env: notExe, cache: cache, wantErr: "run `make setup-test`"},
		{name: "the cache is used when the variable is unset", cache: cache, want: cached},
		{name: "nothing found says to run make setup-test", cache: filepath.Join(dir, "empty"), wantErr: "run `make setup-test`"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(MinIOBinEnv, tt.env)
			t.Setenv("GATEHOUSE_CACHE", tt.cache)
			t.Setenv("PATH", filepath.Join(dir, "no-such-dir"))
			got, err := MinIOBin()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("MinIOBin() = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("MinIOBin() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestStartMinIOServesTLSAndStops(t *testing.T) {
	var pid int
	t.Run("start", func(t *testing.T) {
		m := StartMinIO(t, MinIOOptions{SSE: true})
		pid = m.proc.pid()
		client := &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: m.RootCAs, MinVersion: tls.VersionTLS12}},
		}
		if err := httpOK(t.Context(), client, "https://"+m.Endpoint+"/minio/health/ready"); err != nil {
			t.Fatalf("MinIO is not ready over TLS with the returned CA: %v", err)
		}
		data, err := os.ReadFile(m.proc.logPath)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), m.SecretAccessKey) {
			t.Fatal("the MinIO log holds the root password")
		}
	})
	waitGone(t, "minio", pid)
}
