package charts_test

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/helm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/test/monitoringtest"
)

// TestMonitoringOnRealCluster installs both charts with the Helm SDK on a
// real API server without the Prometheus Operator's CRDs (no ServiceMonitor
// or PrometheusRule, and the install works), then installs the CRDs and
// upgrades the releases: Helm's discovery now finds the kinds, and the API
// server accepts the ServiceMonitors and PrometheusRules against the
// Operator's schemas; the stored PrometheusRule is the rules file the alert
// tests check.
//
// testdata/crds holds the Operator's ServiceMonitor and PrometheusRule CRDs,
// generated from its API module (github.com/prometheus-operator/
// prometheus-operator/pkg/apis/monitoring v0.95.2) the way upstream makes
// them: controller-gen crd:crdVersions=v1,maxDescLen=0
// paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1.
func TestMonitoringOnRealCluster(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}); err != nil {
		t.Fatal(err)
	}
	kinds := func(manifest string) map[string]bool {
		got := map[string]bool{}
		for _, doc := range strings.Split(manifest, "\n---") {
			o := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
				t.Fatal(err)
			}
			if o.Object != nil {
				got[o.GetKind()] = true
			}
		}
		return got
	}
	names := []string{"gatehouse-joinservice", "gatehouse-keyservice"}
	for _, name := range names {
		cfg, err := helm.Config(env.KubeconfigPath, charts.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := charts.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		install := action.NewInstall(cfg)
		install.ReleaseName, install.Namespace = name, charts.Namespace
		rel, err := install.RunWithContext(ctx, ch, monitoringtest.RequiredValues(name))
		if err != nil {
			t.Fatalf("installing %s without the Operator's CRDs: %v", name, err)
		}
		if k := kinds(rel.Manifest); k["ServiceMonitor"] || k["PrometheusRule"] {
			t.Errorf("%s without the Operator's CRDs rendered %v", name, k)
		}
	}

	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join("testdata", "crds")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		cfg, err := helm.Config(env.KubeconfigPath, charts.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := charts.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		upgrade := action.NewUpgrade(cfg)
		upgrade.Namespace = charts.Namespace
		rel, err := upgrade.RunWithContext(ctx, name, ch, monitoringtest.RequiredValues(name))
		if err != nil {
			t.Fatalf("upgrading %s with the Operator's CRDs: %v", name, err)
		}
		if k := kinds(rel.Manifest); !k["ServiceMonitor"] || !k["PrometheusRule"] {
			t.Errorf("%s with the Operator's CRDs rendered %v", name, k)
		}
		for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
			o := &unstructured.Unstructured{}
			o.SetAPIVersion("monitoring.coreos.com/v1")
			o.SetKind(kind)
			if err := c.Get(ctx, types.NamespacedName{Namespace: charts.Namespace, Name: name}, o); err != nil {
				t.Errorf("%s %s: %v", kind, name, err)
				continue
			}
			if kind != "PrometheusRule" {
				continue
			}
			stored, err := yaml.Marshal(o.Object["spec"])
			if err != nil {
				t.Fatal(err)
			}
			if want := monitoringtest.AlertRules(t, name, nil); string(stored) != string(want) {
				t.Errorf("the stored PrometheusRule %s differs from the rules the alert tests check:\n%s\nwant:\n%s", name, stored, want)
			}
		}
	}
}
