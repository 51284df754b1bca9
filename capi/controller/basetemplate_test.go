package controller_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/basetemplate"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/controller/controllertest"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// installScript is the data's script that downloads and checks the
// components.
const installScript = "/etc/gatehouse/install-kubernetes.sh"

// TestTemplateDirectory: with a template directory, a Kubernetes version
// is supported exactly when its template exists. A Machine of a version
// without one gets the NoBaseTemplate condition naming the version and
// the file to add, and no data; once the file is added the same
// reconciler (no restart, no rebuild) renders data downloading the
// template's URLs, and a changed file is read again.
func TestTemplateDirectory(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	dir := t.TempDir()
	templates, err := basetemplate.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := e.reconciler(controller.Config{Templates: templates})
	_, cfg, err := e.Machine(t.Context(), cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	version := controllertest.KubernetesVersion
	want := filepath.Join(dir, version, basetemplate.FileName)
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(cfg.Status.Conditions, controller.ConditionDataSecretAvailable)
	if cond == nil || cond.Reason != controller.ReasonNoBaseTemplate || !strings.Contains(cond.Message, version) || !strings.Contains(cond.Message, want) || cfg.Status.DataSecretName != nil {
		t.Fatalf("without a template: condition %+v, data %v; want %s naming %s and %s", cond, cfg.Status.DataSecretName, controller.ReasonNoBaseTemplate, version, want)
	}

	release, err := versions.Resolve(version)
	if err != nil {
		t.Fatal(err)
	}
	write := func(m *mirror.Mirror) {
		t.Helper()
		f, err := basetemplate.FromTable(release, m, []string{"amd64"})
		if err != nil {
			t.Fatal(err)
		}
		data, err := yaml.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
			t.Fatal(err)
		}
		// A longer file each time: the size tells the change even where
		// the file system's clock is coarse.
		data = append(data, []byte("# "+m.Files+"\n")...)
		if err := os.WriteFile(want, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(&mirror.Mirror{Files: "https://first.example/files"})
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	files, _ := e.dataFiles(t, cfg)
	script := string(files[installScript])
	if !strings.Contains(script, "'https://first.example/files/dl.k8s.io/release/"+version+"/bin/linux/amd64/kubelet'") || strings.Contains(script, "'https://dl.k8s.io/") {
		t.Fatalf("the install script does not download the template's URLs:\n%s", script)
	}

	// A changed template is read again by the same reconciler: a new
	// Machine renders with it.
	write(&mirror.Mirror{Files: "https://second.example/mirror"})
	_, cfg2, err := e.Machine(t.Context(), cluster, "worker-2", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg2); err != nil {
		t.Fatal(err)
	}
	files, _ = e.dataFiles(t, cfg2)
	if script := string(files[installScript]); !strings.Contains(script, "'https://second.example/mirror/dl.k8s.io/") {
		t.Fatalf("the changed template was not read again:\n%s", script)
	}

	// A template without the Machine's architecture does not support it.
	_, cfg3, err := e.Machine(t.Context(), cluster, "worker-arm", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, Architecture: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg3); err != nil {
		t.Fatal(err)
	}
	cond = meta.FindStatusCondition(cfg3.Status.Conditions, controller.ConditionDataSecretAvailable)
	if cond == nil || cond.Reason != controller.ReasonNoBaseTemplate || !strings.Contains(cond.Message, "arm64") || !strings.Contains(cond.Message, want) {
		t.Fatalf("arm64 without its list: condition %+v", cond)
	}
}

// TestMirror: with a mirror, the versions table's downloads come from its
// file server (same sha256 digests) and the first control plane's kubeadm
// pulls its images from its registry; an attested Machine's data carries
// no containerd hosts files (the node image's /etc is read-only: its
// containerd gets the mirror from the join ticket, on its state disk).
func TestMirror(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", false)
	m := &mirror.Mirror{Files: "http://mirror.example:8080", Registry: "mirror.example:5000"}
	r := e.reconciler(controller.Config{Mirror: m})
	_, cfg, err := e.Machine(t.Context(), cluster, "cp", true, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	files, _ := e.dataFiles(t, cfg)
	script := string(files[installScript])
	release, err := versions.Resolve(controllertest.KubernetesVersion)
	if err != nil {
		t.Fatal(err)
	}
	list, err := release.Components("amd64")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		mapped := "'http://mirror.example:8080/" + strings.TrimPrefix(c.URL, "https://") + "'"
		if !strings.Contains(script, mapped) || !strings.Contains(script, strings.TrimPrefix(c.Hash, "sha256:")) {
			t.Errorf("the install script lacks %s with its digest", mapped)
		}
	}
	if strings.Contains(script, "https://") {
		t.Errorf("the install script still downloads from the internet:\n%s", script)
	}
	config := kubeadmConfig(files)
	if !strings.Contains(string(config), "imageRepository: mirror.example:5000/registry.k8s.io") {
		t.Fatalf("the kubeadm configuration does not pull from the mirror:\n%s", config)
	}
	// kubeadm names CoreDNS <imageRepository>/coredns unless told: the
	// mirror keeps its coredns/coredns path.
	if !strings.Contains(string(config), "imageRepository: mirror.example:5000/registry.k8s.io/coredns") {
		t.Fatalf("the kubeadm configuration does not pull CoreDNS from its mirrored path:\n%s", config)
	}
	kubeadmValidate(t, config)
	// containerd pulls the pause image and every registry.k8s.io and
	// docker.io image from the mirror.
	for upstream, host := range map[string]string{"registry.k8s.io": "https://mirror.example:5000/v2/registry.k8s.io", "docker.io": "https://mirror.example:5000/v2/docker.io"} {
		if hosts := string(files["/etc/containerd/certs.d/"+upstream+"/hosts.toml"]); !strings.Contains(hosts, `[host."`+host+`"]`) {
			t.Errorf("the machine's containerd hosts file for %s:\n%s", upstream, hosts)
		}
	}

	initialized := e.Cluster(t, ns, "c2", true)
	e.SeedCA(t, initialized)
	_, attested, err := e.Machine(t.Context(), initialized, "attested-worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig,
		Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, attested); err != nil {
		t.Fatal(err)
	}
	if attested.Status.DataSecretName == nil {
		t.Fatalf("attested worker: no data: conditions %+v", attested.Status.Conditions)
	}
	files, _ = e.dataFiles(t, attested)
	for path := range files {
		if strings.HasPrefix(path, "/etc/containerd/") {
			t.Errorf("an attested Machine's data writes %s under the node image's read-only /etc", path)
		}
	}
}
