package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// registryConfig is the CNCF distribution registry's configuration: plain
// HTTP on addr, storage under dir.
const registryConfig = `version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s
`

// StartRegistry runs the CNCF distribution registry the local cluster runs
// (the add-on binaries' registry, AddonBinDir) on a free loopback port over
// plain HTTP until the test ends, and returns its host:port.
func StartRegistry(t testing.TB) string {
	t.Helper()
	bin, err := AddonBinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const attempts = 3
	for i := 1; ; i++ {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		addr := hostPort(ports[0])
		cfg := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, filepath.Join(dir, "storage"), addr), 0o600); err != nil {
			t.Fatal(err)
		}
		proc, err := startProcess("registry", dir, filepath.Join(bin, "registry"), "serve", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proc.stop)
		err = proc.waitReady(ctx, 50*time.Millisecond, func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v2/", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET /v2/: %s", resp.Status)
			}
			return nil
		})
		if err == nil {
			return addr
		}
		if tail := proc.logTail(8192); i == attempts || !strings.Contains(tail, "address already in use") {
			t.Fatalf("starting the registry: %v\n%s", err, tail)
		}
		proc.stop()
	}
}
