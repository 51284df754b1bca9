package charts_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/test/monitoringtest"
)

// defaultRunbookURL is the charts' monitoring.runbookURL.
const defaultRunbookURL = "https://github.com/gatehouse-dev/gatehouse/blob/main/docs/operations.md"

// rulesFile is a Prometheus rules file, as far as the tests read it.
type rulesFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// unitTests is a promtool unit test file, as far as the tests read it.
type unitTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// promtool runs the tests' promtool with args in dir and returns its
// output; it fails t when promtool fails.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(monitoringtest.PrometheusDir(t), "promtool"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules renders each chart's PrometheusRule with the Helm SDK,
// exactly as it ships, and has the real promtool check it (`promtool check
// rules`) and run its unit tests (`promtool test rules`,
// testdata/<chart>.alerts_test.yaml); every alert must have a case where
// it fires and one where it must not, a severity, a summary, a description
// and a runbook_url whose anchor is a section of docs/operations.md.
func TestAlertRules(t *testing.T) {
	anchors := docAnchors(t)
	for _, name := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			rules := monitoringtest.AlertRules(t, name, nil)
			if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
				t.Fatal(err)
			}
			tests, err := os.ReadFile(filepath.Join("testdata", name+".alerts_test.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600); err != nil {
				t.Fatal(err)
			}
			if out := promtool(t, dir, "check", "rules", "--lint-fatal", "rules.yaml"); !strings.Contains(out, "SUCCESS") {
				t.Errorf("promtool check rules:\n%s", out)
			}
			if out := promtool(t, dir, "test", "rules", "alerts_test.yaml"); !strings.Contains(out, "SUCCESS") {
				t.Errorf("promtool test rules:\n%s", out)
			}

			var rf rulesFile
			if err := yaml.Unmarshal(rules, &rf); err != nil {
				t.Fatal(err)
			}
			var ut unitTests
			if err := yaml.Unmarshal(tests, &ut); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ut.RuleFiles, []string{"rules.yaml"}) {
				t.Errorf("the unit tests read %v, want the rendered rules.yaml only", ut.RuleFiles)
			}
			fires, quiet := map[string]int{}, map[string]int{}
			for _, tc := range ut.Tests {
				for _, a := range tc.AlertRuleTest {
					if len(a.ExpAlerts) > 0 {
						fires[a.Alertname]++
					} else {
						quiet[a.Alertname]++
					}
				}
			}
			alerts := 0
			for _, g := range rf.Groups {
				for _, r := range g.Rules {
					if r.Alert == "" {
						continue
					}
					alerts++
					if fires[r.Alert] == 0 || quiet[r.Alert] == 0 {
						t.Errorf("alert %s: %d unit tests where it fires and %d where it must not; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
					}
					if s := r.Labels["severity"]; s != "warning" && s != "critical" {
						t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
					}
					if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
						t.Errorf("alert %s: no summary or description: %v", r.Alert, r.Annotations)
					}
					url := r.Annotations["runbook_url"]
					base, anchor, _ := strings.Cut(url, "#")
					if base != defaultRunbookURL || !anchors[anchor] || anchor != strings.ToLower(r.Alert) {
						t.Errorf("alert %s: runbook_url %q: want %s#%s, a section of docs/operations.md", r.Alert, url, defaultRunbookURL, strings.ToLower(r.Alert))
					}
				}
			}
			if alerts == 0 {
				t.Fatal("no alert rendered")
			}
		})
	}
}

// docAnchors returns the anchors of docs/operations.md's headings, as
// GitHub makes them: lower case, spaces to hyphens, punctuation dropped.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return anchors
}

// TestMonitoringResources renders the charts' monitoring resources: the
// ServiceMonitor and the PrometheusRule only when the cluster serves
// their kinds and they are enabled, each ServiceMonitor naming a port of
// its chart's Service and selecting it; the dashboard ConfigMap unless
// turned off; and a rules file that uses a value monitoring.alerts does
// not set is refused, naming it.
func TestMonitoringResources(t *testing.T) {
	off := map[string]any{"serviceMonitor": map[string]any{"enabled": false}, "prometheusRule": map[string]any{"enabled": false}, "dashboard": map[string]any{"enabled": false}}
	cases := []struct {
		name, chart string
		monitoring  map[string]any
		apis        []string
		want        []string
	}{
		{"join service without the Operator's kinds", "gatehouse-joinservice", nil, nil, []string{"ConfigMap/gatehouse-dashboard"}},
		{"join service with them", "gatehouse-joinservice", nil, monitoringtest.MonitoringAPIs(),
			[]string{"ConfigMap/gatehouse-dashboard", "PrometheusRule/gatehouse-joinservice", "ServiceMonitor/gatehouse-joinservice"}},
		{"join service with them, turned off", "gatehouse-joinservice", off, monitoringtest.MonitoringAPIs(), nil},
		{"key service without the Operator's kinds", "gatehouse-keyservice", nil, nil, nil},
		{"key service with them", "gatehouse-keyservice", nil, monitoringtest.MonitoringAPIs(),
			[]string{"PrometheusRule/gatehouse-keyservice", "ServiceMonitor/gatehouse-keyservice"}},
		{"key service with them, turned off", "gatehouse-keyservice", off, monitoringtest.MonitoringAPIs(), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			values := map[string]any{}
			if tc.monitoring != nil {
				values["monitoring"] = tc.monitoring
			}
			objs, err := monitoringtest.Render(t, tc.chart, values, tc.apis...)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			ports := map[string]bool{}
			var serviceLabels map[string]string
			for _, o := range objs {
				switch o.GetKind() {
				case "Service":
					serviceLabels = o.GetLabels()
					list, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
					for _, p := range list {
						ports[p.(map[string]any)["name"].(string)] = true
					}
				case "ServiceMonitor", "PrometheusRule":
					got = append(got, o.GetKind()+"/"+o.GetName())
				case "ConfigMap":
					if o.GetName() == "gatehouse-dashboard" {
						got = append(got, "ConfigMap/"+o.GetName())
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("monitoring resources %v, want %v", got, tc.want)
			}
			for _, o := range objs {
				if o.GetKind() != "ServiceMonitor" {
					continue
				}
				endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
				for _, e := range endpoints {
					if p := e.(map[string]any)["port"].(string); !ports[p] {
						t.Errorf("the ServiceMonitor scrapes port %q; the Service has %v", p, ports)
					}
				}
				sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
				for k, v := range sel {
					if serviceLabels[k] != v {
						t.Errorf("the ServiceMonitor selects %s=%v; the Service is labelled %v", k, v, serviceLabels)
					}
				}
			}
		})
	}
	t.Run("an unset threshold is refused", func(t *testing.T) {
		_, err := monitoringtest.Render(t, "gatehouse-joinservice", map[string]any{"monitoring": map[string]any{"alerts": map[string]any{"nodeNotAttestedFor": nil}}},
			monitoringtest.MonitoringAPIs()...)
		if err == nil || !strings.Contains(err.Error(), "files/alerts.yaml uses [[ nodeNotAttestedFor ]], which monitoring.alerts does not set") {
			t.Errorf("rendering without monitoring.alerts.nodeNotAttestedFor: %v", err)
		}
	})
}

// TestDashboard checks the Grafana dashboard the join service chart ships:
// the ConfigMap carries files/dashboard.json as it is, labelled for
// Grafana's sidecar; it is a dashboard with a uid; and every panel's query
// is PromQL the real Prometheus parser accepts (promtool check rules, each
// query a recording rule, Grafana's $__rate_interval as 5m).
func TestDashboard(t *testing.T) {
	file, err := os.ReadFile(filepath.Join("gatehouse-joinservice", "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := monitoringtest.Render(t, "gatehouse-joinservice", nil)
	if err != nil {
		t.Fatal(err)
	}
	var shipped string
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "gatehouse-dashboard" {
			if o.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("the dashboard ConfigMap's labels %v lack grafana_dashboard: \"1\"", o.GetLabels())
			}
			shipped, _, _ = unstructured.NestedString(o.Object, "data", "gatehouse.json")
		}
	}
	if shipped != strings.TrimSuffix(string(file), "\n") {
		t.Fatal("the dashboard ConfigMap does not carry files/dashboard.json as it is")
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(file, &dash); err != nil {
		t.Fatalf("files/dashboard.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("the dashboard has no uid or title")
	}
	var rules bytes.Buffer
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	queries := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			expr, err := json.Marshal(strings.ReplaceAll(q.Expr, "$__rate_interval", "5m"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", queries, expr)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yaml"), rules.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := promtool(t, dir, "check", "rules", "--lint-fatal", "dashboard.rules.yaml"); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules on the dashboard's %d queries:\n%s", queries, out)
	}
}
