package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/helm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const cmTemplate = `apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
  namespace: {{ .Release.Namespace }}
data:
  greeting: {{ .Values.greeting | quote }}
  color: {{ .Values.color | quote }}
`

// demoChart is a chart whose default color changes with the version; bad
// adds an object the API server rejects.
func demoChart(version, color string, bad bool) *chart.Chart {
	c := &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: "v2", Name: "demo", Version: version},
		Templates: []*chart.File{{Name: "templates/cm.yaml", Data: []byte(cmTemplate)}},
		Values:    map[string]any{"greeting": "hello", "color": color},
	}
	if bad {
		c.Templates = append(c.Templates, &chart.File{Name: "templates/bad.yaml", Data: []byte(
			"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Not_A_Valid_Name\n  namespace: {{ .Release.Namespace }}\n")})
	}
	return c
}

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

const widget = `apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
  namespace: default
spec:
  size: 3
`

func kubectl(t *testing.T, env *testenv.Env, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(env.BinDir, "kubectl"), append([]string{"--kubeconfig", env.KubeconfigPath}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// outcome is the outcome of the only release of results, or what came
// instead.
func outcome(results []Result) string {
	if len(results) != 1 {
		return fmt.Sprintf("%d results, want 1", len(results))
	}
	return results[0].Outcome
}

// installDemo installs release demo of chart 0.1.0 (blue) with greeting
// "hi" where opts upgrades, and returns Helm's configuration there.
func installDemo(t *testing.T, opts Options) *action.Configuration {
	t.Helper()
	cfg, err := helm.Config(opts.Kubeconfig, opts.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "demo", "default"
	if _, err := install.Run(demoChart("0.1.0", "blue", false), map[string]any{"greeting": "hi"}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestApply(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	root := t.TempDir()
	var out bytes.Buffer
	opts := Options{Kubeconfig: env.KubeconfigPath, Namespace: "default", BackupRoot: root,
		Order: []string{"demo"}, Timeout: time.Minute, Out: &out}
	cfg := installDemo(t, opts)
	kubectl(t, env, widgetCRD, "apply", "-f", "-")
	// The CRD becomes established asynchronously.
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.KubeconfigPath, "apply", "-f", "-")
		cmd.Stdin = strings.NewReader(widget)
		return cmd.Run() == nil, nil
	})
	if err != nil {
		t.Fatalf("creating a Widget: %v", err)
	}
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	color := func() string {
		cm, err := client.CoreV1().ConfigMaps("default").Get(t.Context(), "demo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data["greeting"] + "/" + cm.Data["color"]
	}

	t.Run("upgrade merges the cluster's values onto the new defaults", func(t *testing.T) {
		opts.Charts = map[string]*chart.Chart{"demo": demoChart("0.2.0", "green", false)}
		results, err := Apply(t.Context(), opts)
		if err != nil || outcome(results) != "upgraded" {
			t.Fatalf("Apply: %v %+v\n%s", err, results, &out)
		}
		if got := color(); got != "hi/green" {
			t.Fatalf("ConfigMap %s, want the cluster's greeting and the new default color", got)
		}
	})

	t.Run("values set over the release's own, with the same chart; the same again is unchanged", func(t *testing.T) {
		opts.Values = map[string]map[string]any{"demo": {"greeting": "hello"}}
		defer func() { opts.Values = nil }()
		results, err := Apply(t.Context(), opts)
		if err != nil || outcome(results) != "upgraded" {
			t.Fatalf("Apply with values: %v %+v\n%s", err, results, &out)
		}
		if got := color(); got != "hello/green" {
			t.Fatalf("ConfigMap %s, want the value set and the chart's color", got)
		}
		results, err = Apply(t.Context(), opts)
		if err != nil || outcome(results) != "unchanged" {
			t.Fatalf("Apply with the same values again: %v %+v", err, results)
		}
		opts.Values = map[string]map[string]any{"demo": {"greeting": "hi"}}
		if _, err := Apply(t.Context(), opts); err != nil || color() != "hi/green" {
			t.Fatalf("setting the greeting back: %v, %s", err, color())
		}
	})

	backups, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*", "backups"))
	t.Run("backups re-apply with server-side apply", func(t *testing.T) {
		if len(backups) != 3 {
			t.Fatalf("backup directories %v, want one per changing Apply (three)", backups)
		}
		for _, f := range []string{"crds/widgets.example.com.yaml", "resources/widgets.example.com/default/w1.yaml"} {
			if _, err := os.Stat(filepath.Join(backups[0], f)); err != nil {
				t.Fatalf("backup lacks %s: %v", f, err)
			}
		}
		if !strings.Contains(out.String(), backups[0]) {
			t.Fatal("Apply did not say where the backups are")
		}
		kubectl(t, env, "", "delete", "widget", "w1", "-n", "default")
		kubectl(t, env, "", "apply", "--server-side", "-R", "-f", backups[0])
		if got := kubectl(t, env, "", "get", "widget", "w1", "-n", "default", "-o", "jsonpath={.spec.size}"); got != "3" {
			t.Fatalf("restored Widget has size %q", got)
		}
	})

	t.Run("dry run shows the change and changes nothing", func(t *testing.T) {
		out.Reset()
		opts.DryRun = true
		opts.Charts = map[string]*chart.Chart{"demo": demoChart("0.3.0", "red", false)}
		results, err := Apply(t.Context(), opts)
		opts.DryRun = false
		if err != nil || outcome(results) != "would upgrade" {
			t.Fatalf("dry run: %v %+v", err, results)
		}
		for _, want := range []string{"~ ConfigMap default/demo (changed)", `-  color: "green"`, `+  color: "red"`} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("dry run output lacks %q:\n%s", want, &out)
			}
		}
		if color() != "hi/green" {
			t.Fatal("the dry run changed the ConfigMap")
		}
		if more, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*")); len(more) != 3 {
			t.Fatalf("the dry run wrote backups: %v", more)
		}
	})

	t.Run("a failed upgrade rolls back", func(t *testing.T) {
		opts.Charts = map[string]*chart.Chart{"demo": demoChart("0.3.0", "red", true)}
		results, err := Apply(t.Context(), opts)
		if err == nil || outcome(results) != "rolled back" {
			t.Fatalf("bad chart: %v %+v", err, results)
		}
		deployed, err := cfg.Releases.Deployed("demo")
		if err != nil || deployed.Chart.Metadata.Version != "0.2.0" {
			t.Fatalf("deployed after the failure: %v %v", deployed.Chart.Metadata.Version, err)
		}
		if got := color(); got != "hi/green" {
			t.Fatalf("ConfigMap %s after the rollback, want the 0.2.0 one", got)
		}
	})

	t.Run("an interrupted upgrade is recovered", func(t *testing.T) {
		// As if an earlier run died mid-upgrade: a newer revision left pending.
		last, err := cfg.Releases.Last("demo")
		if err != nil {
			t.Fatal(err)
		}
		pending := *last
		info := *last.Info
		pending.Info, pending.Version = &info, last.Version+1
		pending.Info.Status = release.StatusPendingUpgrade
		if err := cfg.Releases.Create(&pending); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		opts.Charts = map[string]*chart.Chart{"demo": demoChart("0.3.0", "red", false)}
		// A dry run leaves the interrupted revision alone.
		dry := opts
		dry.DryRun = true
		results, err := Apply(t.Context(), dry)
		if err != nil || outcome(results) != "would roll back and upgrade" {
			t.Fatalf("dry run after an interruption: %v %+v\n%s", err, results, &out)
		}
		if still, err := cfg.Releases.Last("demo"); err != nil || still.Version != pending.Version || !still.Info.Status.IsPending() {
			t.Fatalf("the dry run changed the interrupted release: %v %+v", err, still)
		}
		out.Reset()
		results, err = Apply(t.Context(), opts)
		if err != nil || outcome(results) != "upgraded" || !strings.Contains(out.String(), "interrupted") {
			t.Fatalf("after an interruption: %v %+v\n%s", err, results, &out)
		}
		if got := color(); got != "hi/red" {
			t.Fatalf("ConfigMap %s", got)
		}
	})

	t.Run("two upgrades in the same second keep their own backups", func(t *testing.T) {
		before, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*", "backups"))
		same := opts
		at := time.Date(2026, 11, 25, 5, 0, 0, 0, time.UTC)
		same.Now = func() time.Time { return at }
		var dirs []string
		for _, version := range []string{"0.3.1", "0.3.2"} {
			out.Reset()
			same.Charts = map[string]*chart.Chart{"demo": demoChart(version, "red", false)}
			results, err := Apply(t.Context(), same)
			if err != nil || outcome(results) != "upgraded" {
				t.Fatalf("upgrade to %s at %s: %v (%s)\n%s", version, at, err, outcome(results), &out)
			}
			after, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*", "backups"))
			fresh := slices.DeleteFunc(after, func(d string) bool { return slices.Contains(before, d) || slices.Contains(dirs, d) })
			if len(fresh) != 1 || !strings.Contains(out.String(), fresh[0]) {
				t.Fatalf("upgrade to %s made backups %v, want one new directory that the output names:\n%s", version, fresh, &out)
			}
			dirs = append(dirs, fresh[0])
			if _, err := os.Stat(filepath.Join(fresh[0], "resources/widgets.example.com/default/w1.yaml")); err != nil {
				t.Fatalf("backup %s is incomplete: %v", fresh[0], err)
			}
		}
		if partial, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*", "*.partial")); len(partial) > 0 {
			t.Errorf("partial backups left: %v", partial)
		}
	})

	t.Run("skipping a minor version is refused before any change", func(t *testing.T) {
		before, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*"))
		opts.Charts = map[string]*chart.Chart{"demo": demoChart("0.5.0", "red", false)}
		if _, err := Apply(t.Context(), opts); err == nil || !strings.Contains(err.Error(), "skips 1 minor version") {
			t.Fatalf("0.3.2 → 0.5.0: %v", err)
		}
		if after, _ := filepath.Glob(filepath.Join(root, "gatehouse-upgrade", "*")); len(after) != len(before) {
			t.Fatal("a refused upgrade wrote backups")
		}
	})
}

func TestCheckStep(t *testing.T) {
	for _, tc := range []struct {
		from, to, err string
	}{
		{"0.2.0", "0.2.0", ""}, {"0.2.0", "0.2.5", ""}, {"0.2.0", "0.3.0", ""},
		{"0.2.0", "0.4.0", "skips 1 minor"}, {"0.3.0", "0.2.0", "downgrades"}, {"0.9.0", "1.0.0", "major"}, {"x", "0.1.0", "semantic"},
	} {
		err := checkStep(tc.from, tc.to)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s → %s: %v, want %q", tc.from, tc.to, err, tc.err)
		}
	}
}

func TestMergeValues(t *testing.T) {
	values := map[string]any{"joinConfig": map[string]any{"kubernetesVersion": "v1.35.8", "apiServerEndpoint": "10.0.0.1:6443"}, "replicas": 2}
	got := mergeValues(values, map[string]any{"joinConfig": map[string]any{"kubernetesVersion": "v1.36.4"}, "image": "x"})
	want := map[string]any{"joinConfig": map[string]any{"kubernetesVersion": "v1.36.4", "apiServerEndpoint": "10.0.0.1:6443"}, "replicas": 2, "image": "x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergeValues = %v, want %v", got, want)
	}
	if values["joinConfig"].(map[string]any)["kubernetesVersion"] != "v1.35.8" {
		t.Error("mergeValues changed its input")
	}
	if changesValues(values, nil) || changesValues(nil, nil) || !changesValues(values, map[string]any{"replicas": 3}) || changesValues(values, map[string]any{"replicas": 2}) {
		t.Error("changesValues")
	}
}

// TestKeepCharts: a values-only upgrade (a join policy change before the
// Kubernetes roll) sets the values and keeps the deployed chart, even
// when a newer chart is at hand; ReleaseValues reads the values back.
func TestKeepCharts(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	var out bytes.Buffer
	opts := Options{Kubeconfig: env.KubeconfigPath, Namespace: "default", BackupRoot: t.TempDir(),
		Order: []string{"demo"}, Timeout: time.Minute, Out: &out, KeepCharts: true,
		Charts: map[string]*chart.Chart{"demo": demoChart("0.2.0", "green", false)},
		Values: map[string]map[string]any{"demo": {"greeting": "moved"}}}
	installDemo(t, opts)
	results, err := Apply(t.Context(), opts)
	if err != nil || outcome(results) != "upgraded" || results[0].To != "0.1.0" {
		t.Fatalf("values-only upgrade: %+v, %v\n%s", results, err, out.String())
	}
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps("default").Get(t.Context(), "demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["greeting"] != "moved" || cm.Data["color"] != "blue" {
		t.Errorf("after a values-only upgrade the ConfigMap says %v: want the new greeting and the deployed chart's color", cm.Data)
	}
	values, err := ReleaseValues(opts.Kubeconfig, opts.Namespace, "demo")
	if err != nil || values["greeting"] != "moved" {
		t.Errorf("ReleaseValues = %v, %v; want the greeting set", values, err)
	}
	if results, err := Apply(t.Context(), opts); err != nil || outcome(results) != "unchanged" {
		t.Errorf("the same values again: %+v, %v; want unchanged", results, err)
	}
}
