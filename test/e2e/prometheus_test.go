package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/test/monitoringtest"
)

// promServer is a real Prometheus (the tests' pinned build,
// hack/prometheus-binary.sh) on the host's loopback, scraping the local
// cluster's join services every second and evaluating the join service
// chart's alert rules, rendered as the chart ships them, every second.
type promServer struct {
	api     promv1.API
	log     string    // its log file
	started time.Time // when the process started
}

// startPrometheus starts Prometheus scraping the join service replicas at
// targets (host:port of their metrics) as the job the chart's
// ServiceMonitor names, with the chart's rules rendered with the
// thresholds alerts (monitoring.alerts values). It stops when the test
// ends. Without the tests' Prometheus build it fails with CI set, and
// returns nil otherwise (the alert checks are then logged as not run).
func startPrometheus(ctx context.Context, t *testing.T, targets []string, alerts map[string]any) *promServer {
	t.Helper()
	bin, err := monitoringtest.FindPrometheus()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Logf("not checking alerts: %v", err)
		return nil
	}
	dir := t.TempDir()
	rules := monitoringtest.AlertRules(t, "gatehouse-joinservice", map[string]any{"alerts": alerts})
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	config, err := yaml.Marshal(map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
		"rule_files": []string{"rules.yaml"},
		"scrape_configs": []any{map[string]any{
			"job_name":       "gatehouse-joinservice",
			"static_configs": []any{map[string]any{"targets": targets}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yaml"), config, 0o600); err != nil {
		t.Fatal(err)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	_ = probe.Close()
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(pctx, filepath.Join(bin, "prometheus"),
		"--config.file="+filepath.Join(dir, "prometheus.yaml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logFile, logFile
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting Prometheus: %v", err)
	}
	p := &promServer{log: logPath, started: time.Now()}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			p.dumpLog(t)
		}
	})
	client, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	p.api = promv1.NewAPI(client)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/-/ready", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("Prometheus is not ready at %s: %v", addr, err)
	}
	return p
}

// dumpLog logs Prometheus's log.
func (p *promServer) dumpLog(t *testing.T) {
	t.Helper()
	data, _ := os.ReadFile(p.log)
	t.Logf("Prometheus log:\n%s", data)
}

// waitScraped waits until every target is up and the replicas' metrics
// say what a healthy cluster's do: one replica leads continuous
// attestation, each reports its loaded certificates' expiry, and the
// leader exports node's status as Verified.
func (p *promServer) waitScraped(ctx context.Context, t *testing.T, targets int, node string) {
	t.Helper()
	if p == nil {
		return
	}
	checks := []struct{ what, query, want string }{
		{"replicas up", `sum(up{job="gatehouse-joinservice"})`, strconv.Itoa(targets)},
		{"replicas leading continuous attestation", `sum(gatehouse_reattest_leader{job="gatehouse-joinservice"})`, "1"},
		{"certificates with an expiry, three per replica", `count(gatehouse_certificate_expiry_timestamp_seconds{job="gatehouse-joinservice"} > time())`, strconv.Itoa(3 * targets)},
		{node + " Verified", fmt.Sprintf(`sum(gatehouse_reattest_node_status{job="gatehouse-joinservice", node=%q, reason="Verified"})`, node), "1"},
	}
	for _, c := range checks {
		var got string
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			v, _, err := p.api.Query(ctx, c.query, time.Now())
			if err != nil {
				got = err.Error()
				return false, nil
			}
			got = v.String()
			vec, ok := v.(model.Vector)
			return ok && len(vec) == 1 && vec[0].Value.String() == c.want, nil
		})
		if err != nil {
			t.Fatalf("Prometheus: %s: %s is %s, want %s", c.what, c.query, got, c.want)
		}
	}
	t.Logf("Prometheus scrapes %d join service replicas: one leads, each loaded its certificates, %s is Verified (%s after its start)",
		targets, node, time.Since(p.started).Round(100*time.Millisecond))
}

// waitAlert waits until alert is firing for node (firing true), or is
// neither firing nor pending for it (false), as Prometheus's
// /api/v1/alerts says, within a minute.
func (p *promServer) waitAlert(ctx context.Context, t *testing.T, alert, node string, firing bool) {
	t.Helper()
	if p == nil {
		t.Logf("not checking that %s fires for %s: no Prometheus", alert, node)
		return
	}
	start := time.Now()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		res, err := p.api.Alerts(ctx)
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		active := false
		for _, a := range res.Alerts {
			seen = append(seen, fmt.Sprintf("%s{node=%s} %s", a.Labels["alertname"], a.Labels["node"], a.State))
			if string(a.Labels["alertname"]) != alert || string(a.Labels["node"]) != node {
				continue
			}
			if firing && a.State == promv1.AlertStateFiring {
				if !strings.Contains(string(a.Annotations["runbook_url"]), "docs/operations.md#"+strings.ToLower(alert)) {
					t.Errorf("%s's runbook_url is %q", alert, a.Annotations["runbook_url"])
				}
				t.Logf("%s firing for %s after %s: %s", alert, node, time.Since(start).Round(100*time.Millisecond), a.Annotations["description"])
				return true, nil
			}
			active = true
		}
		return !firing && !active, nil
	})
	if err != nil {
		t.Fatalf("%s for %s: want firing %t; Prometheus's alerts: %v", alert, node, firing, seen)
	}
}
