package mirror

import (
	"strings"
	"testing"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *Mirror
		want string // "" means valid
	}{
		{"no mirror", nil, ""},
		{"both", &Mirror{Files: "https://mirror.example/files", Registry: "mirror.example:5000"}, ""},
		{"files only", &Mirror{Files: "http://10.88.0.1:5080"}, ""},
		{"registry with a prefix", &Mirror{Registry: "mirror.example/k8s"}, ""},
		{"localhost registry", &Mirror{Registry: "localhost/x"}, ""},
		{"empty", &Mirror{}, "set files"},
		{"files without a scheme", &Mirror{Files: "mirror.example/files"}, "not an http:// or https:// URL"},
		{"files over ftp", &Mirror{Files: "ftp://mirror.example"}, "not an http:// or https:// URL"},
		{"files with a query", &Mirror{Files: "https://mirror.example/?a=b"}, "no query"},
		{"files with a user", &Mirror{Files: "https://u:p@mirror.example/"}, "no query, fragment or user"},
		{"registry with a scheme", &Mirror{Registry: "https://mirror.example"}, "without a scheme"},
		{"registry with a trailing slash", &Mirror{Registry: "mirror.example/"}, "trailing slash"},
		{"registry that is a Docker Hub user", &Mirror{Registry: "mirror"}, "not a host"},
		{"registry with upper case", &Mirror{Registry: "mirror.example/K8S"}, "not host[:port][/prefix]"},
		{"plain http registry", &Mirror{Registry: "10.88.1.1:5000", PlainHTTP: true}, ""},
		{"plain http without a registry", &Mirror{Files: "http://10.88.0.1:5080", PlainHTTP: true}, "plainHTTP is set without registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestFileURL(t *testing.T) {
	m := &Mirror{Files: "https://mirror.example/files/"}
	for _, tc := range []struct {
		in, want, err string
	}{
		{"https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", "https://mirror.example/files/dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", ""},
		{"https://github.com/kubernetes-sigs/cri-tools/releases/download/v1.36.0/crictl-v1.36.0-linux-amd64.tar.gz",
			"https://mirror.example/files/github.com/kubernetes-sigs/cri-tools/releases/download/v1.36.0/crictl-v1.36.0-linux-amd64.tar.gz", ""},
		{"http://10.0.0.1:8080/a%20b", "https://mirror.example/files/10.0.0.1:8080/a%20b", ""},
		{"file:///x/kube", "", "only http(s) URLs"},
		{"https://dl.k8s.io/x?sig=1", "", "no query"},
	} {
		got, err := m.FileURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("FileURL(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("FileURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	var none *Mirror
	if got, err := none.FileURL("https://dl.k8s.io/x"); err != nil || got != "https://dl.k8s.io/x" {
		t.Errorf("nil mirror: FileURL = %q, %v", got, err)
	}
	if got, err := (&Mirror{Registry: "mirror.example"}).FileURL("https://dl.k8s.io/x"); err != nil || got != "https://dl.k8s.io/x" {
		t.Errorf("registry-only mirror: FileURL = %q, %v", got, err)
	}
}

func TestComponents(t *testing.T) {
	m := &Mirror{Files: "http://10.88.0.1:5080"}
	in := []*componentsv1.Component{
		{Url: "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", Hash: digest, InstallPath: "/usr/local/bin/kubelet"},
		{Url: "https://github.com/containernetworking/plugins/releases/download/v1.9.1/cni-plugins-linux-amd64-v1.9.1.tgz", Hash: digest, InstallPath: "/opt/cni/bin", Extract: true},
		{Url: "file:///opt/kube", Hash: digest, InstallPath: "/usr/local/bin/kubeadm"},
		{Url: "data:,x", Hash: digest, InstallPath: "/etc/x"},
	}
	out, err := m.Components(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"http://10.88.0.1:5080/dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet",
		"http://10.88.0.1:5080/github.com/containernetworking/plugins/releases/download/v1.9.1/cni-plugins-linux-amd64-v1.9.1.tgz",
		"file:///opt/kube",
		"data:,x",
	}
	for i, c := range out {
		if c.GetUrl() != want[i] || c.GetHash() != in[i].GetHash() || c.GetInstallPath() != in[i].GetInstallPath() || c.GetExtract() != in[i].GetExtract() {
			t.Errorf("component %d = %v, want URL %s and the rest unchanged", i, c, want[i])
		}
	}
	if in[0].GetUrl() != "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet" {
		t.Error("Components modified its input")
	}
}

func TestImage(t *testing.T) {
	m := &Mirror{Registry: "mirror.example:5000"}
	for _, tc := range []struct {
		in, want string
	}{
		{"registry.k8s.io/kube-apiserver:v1.36.4", "mirror.example:5000/registry.k8s.io/kube-apiserver:v1.36.4"},
		{"registry.k8s.io/coredns/coredns:v1.14.2", "mirror.example:5000/registry.k8s.io/coredns/coredns:v1.14.2"},
		{"busybox:1.37", "mirror.example:5000/docker.io/library/busybox:1.37"},
		{"docker.io/local/gatehouse-joinservice:local", "mirror.example:5000/docker.io/local/gatehouse-joinservice:local"},
		{"ghcr.io/gatehouse-dev/joinservice@" + digest, "mirror.example:5000/ghcr.io/gatehouse-dev/joinservice@" + digest},
		{"ghcr.io/gatehouse-dev/joinservice:v1.0.0@" + digest, "mirror.example:5000/ghcr.io/gatehouse-dev/joinservice:v1.0.0@" + digest},
		{"10.88.0.1:5000/team/app", "mirror.example:5000/10.88.0.1_5000/team/app"},
	} {
		got, err := m.Image(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Image(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := m.Image("UPPER/case"); err == nil || !strings.Contains(err.Error(), "UPPER/case") {
		t.Errorf("Image of a malformed name = %v, want an error naming it", err)
	}
	if got := m.ImageRepository(); got != "mirror.example:5000/registry.k8s.io" {
		t.Errorf("ImageRepository() = %q", got)
	}
	var none *Mirror
	if got, err := none.Image("busybox:1"); err != nil || got != "busybox:1" {
		t.Errorf("nil mirror: Image = %q, %v", got, err)
	}
	if got := none.ImageRepository(); got != "" {
		t.Errorf("nil mirror: ImageRepository = %q", got)
	}
}
