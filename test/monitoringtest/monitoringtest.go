// Package monitoringtest renders the charts' monitoring resources for tests
// (the alert tests in charts/, the e2e's Prometheus in test/e2e) and finds
// the tests' Prometheus and promtool build (hack/prometheus-binary.sh).
package monitoringtest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/charts"
)

// PrometheusBinEnv names the environment variable holding the directory of
// the tests' prometheus and promtool (hack/prometheus-binary.sh builds
// them; make unit sets it).
const PrometheusBinEnv = "GATEHOUSE_PROMETHEUS_BIN"

// FindPrometheus returns the directory of the tests' prometheus and
// promtool binaries, from PrometheusBinEnv, or an error saying what is
// missing and how to build them.
func FindPrometheus() (string, error) {
	dir := os.Getenv(PrometheusBinEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: run `make setup-test` (it builds Prometheus and promtool), then the tests with `make test`, or export %s=$(hack/prometheus-binary.sh)", PrometheusBinEnv, PrometheusBinEnv)
	}
	for _, b := range []string{"prometheus", "promtool"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil { //nolint:gosec // the directory the test environment names (hack/prometheus-binary.sh)
			return "", fmt.Errorf("%s=%s holds no %s: run `make setup-test`, or export %s=$(hack/prometheus-binary.sh)", PrometheusBinEnv, dir, b, PrometheusBinEnv)
		}
	}
	return dir, nil
}

// PrometheusDir returns FindPrometheus's directory. When it finds none,
// the test fails with CI set, and is skipped otherwise.
func PrometheusDir(t testing.TB) string {
	t.Helper()
	dir, err := FindPrometheus()
	if err == nil {
		return dir
	}
	if os.Getenv("CI") != "" {
		t.Fatal(err)
	}
	t.Skip(err)
	return ""
}

// MonitoringAPIs are the capabilities of a cluster that serves the
// Prometheus Operator's kinds the charts render (monitoring.coreos.com/v1).
func MonitoringAPIs() []string {
	return []string{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule"}
}

// RequiredValues are values that make chart name render: the join
// service's join config is required.
func RequiredValues(name string) map[string]any {
	if name != "gatehouse-joinservice" {
		return map[string]any{}
	}
	return map[string]any{"joinConfig": map[string]any{
		"attestation":          "variant: tpm\npcrs: [4, 15]\nreferenceValues: {}\npinnedAKs: []\n",
		"measurementSalt":      strings.Repeat("ab", 32),
		"apiServerEndpoint":    "10.0.0.1:6443",
		"kubernetesVersion":    "v1.36.4",
		"kubernetesComponents": "[]",
	}}
}

// Render renders the embedded chart name for a release in
// charts.Namespace as `helm install --dry-run --api-versions …` does,
// without a cluster, with RequiredValues and values (values win), on a
// cluster serving apiVersions besides Kubernetes' own; it returns the
// manifest's objects, or the rendering's error.
func Render(t testing.TB, name string, values map[string]any, apiVersions ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	c, err := charts.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	vals := RequiredValues(name)
	maps.Copy(vals, values)
	install := action.NewInstall(&action.Configuration{})
	install.ClientOnly, install.DryRun, install.ReleaseName, install.Namespace = true, true, name, charts.Namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.4", Major: "1", Minor: "36"}
	install.APIVersions = apiVersions
	rel, err := install.Run(c, vals)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(rel.Manifest, "\n---") {
		o := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			t.Fatalf("rendered YAML of %s: %v", name, err)
		}
		if o.Object != nil && o.GetKind() != "" {
			objs = append(objs, o)
		}
	}
	return objs, nil
}

// AlertRules renders chart name with the values monitoring (nil: the
// chart's defaults) under "monitoring", on a cluster serving the
// Prometheus Operator's kinds, and returns its PrometheusRule's spec: a
// Prometheus rules file (groups), exactly what the Operator hands
// Prometheus.
func AlertRules(t testing.TB, name string, monitoring map[string]any) []byte {
	t.Helper()
	values := map[string]any{}
	if monitoring != nil {
		values["monitoring"] = monitoring
	}
	objs, err := Render(t, name, values, MonitoringAPIs()...)
	if err != nil {
		t.Fatalf("rendering %s: %v", name, err)
	}
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		spec, ok := o.Object["spec"]
		if !ok {
			t.Fatalf("%s's PrometheusRule has no spec", name)
		}
		rules, err := yaml.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		return rules
	}
	t.Fatalf("%s rendered no PrometheusRule", name)
	return nil
}
