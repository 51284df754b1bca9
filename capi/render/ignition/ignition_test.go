package ignition

import (
	"encoding/base64"
	"strings"
	"testing"

	ignition "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
)

func kubeadmSpec() Spec {
	return Spec{
		Files: []File{
			{Path: "/run/kubeadm/kubeadm.yaml", Contents: []byte("apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n"), Mode: 0o600, Owner: "root:root"},
			{Path: "/etc/kubernetes/pki/ca.crt", Contents: []byte("-----BEGIN CERTIFICATE-----\n"), Mode: 0o644},
		},
		Users:       []User{{Name: "ops", Groups: []string{"sudo"}, SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA example"}}},
		Filesystems: []Filesystem{{Device: "/dev/vdb", Format: "ext4", Label: "etcd", Path: "/var/lib/etcd"}},
		Commands: [][]string{
			{"kubeadm", "join", "--config", "/run/kubeadm/kubeadm.yaml"},
			{"/bin/sh", "-c", "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"},
		},
	}
}

func parse(t *testing.T, data []byte) types.Config {
	t.Helper()
	cfg, report, err := ignition.Parse(data)
	if err != nil || report.IsFatal() {
		t.Fatalf("Ignition validator: %v %s", err, report.String())
	}
	return cfg
}

func TestRender(t *testing.T) {
	data, err := Render(kubeadmSpec())
	if err != nil {
		t.Fatal(err)
	}
	cfg := parse(t, data)
	if cfg.Ignition.Version != Version {
		t.Fatalf("version %s", cfg.Ignition.Version)
	}
	files := map[string]types.File{}
	for _, f := range cfg.Storage.Files {
		files[f.Path] = f
	}
	script, ok := files[ScriptPath]
	if !ok {
		t.Fatal("no commands script")
	}
	body, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(*script.Contents.Source, "data:;base64,"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), "'kubeadm' 'join' '--config' '/run/kubeadm/kubeadm.yaml'") || !strings.Contains(string(body), "bootstrap-success.complete") {
		t.Fatalf("commands script:\n%s", body)
	}
	if *files["/run/kubeadm/kubeadm.yaml"].Mode != 0o600 || *files["/run/kubeadm/kubeadm.yaml"].User.Name != "root" {
		t.Fatal("file mode or owner lost")
	}
	units := map[string]bool{}
	for _, u := range cfg.Systemd.Units {
		units[u.Name] = true
	}
	if !units[CommandsUnit] || !units["var-lib-etcd.mount"] {
		t.Fatalf("units %v", units)
	}
	if len(cfg.Passwd.Users) != 1 || cfg.Passwd.Users[0].Name != "ops" {
		t.Fatalf("users %+v", cfg.Passwd.Users)
	}
}

// TestButaneAdditions: user additions in Butane are translated and merged.
func TestButaneAdditions(t *testing.T) {
	s := kubeadmSpec()
	s.ButaneAdditions = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/motd
      contents:
        inline: welcome
systemd:
  units:
    - name: extra.service
      enabled: true
      contents: |
        [Service]
        ExecStart=/bin/true
        [Install]
        WantedBy=multi-user.target
`
	data, err := Render(s)
	if err != nil {
		t.Fatal(err)
	}
	cfg := parse(t, data)
	found := map[string]bool{}
	for _, f := range cfg.Storage.Files {
		found[f.Path] = true
	}
	for _, u := range cfg.Systemd.Units {
		found[u.Name] = true
	}
	if !found["/etc/motd"] || !found["extra.service"] || !found[ScriptPath] {
		t.Fatalf("merged config lacks the additions or the base: %v", found)
	}

	s.ButaneAdditions = "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: relative/path\n"
	if _, err := Render(s); err == nil || !strings.Contains(err.Error(), "Butane") {
		t.Fatalf("invalid Butane: %v", err)
	}
}

// TestValidatorRefuses: the library's validator catches what would fail at
// boot, so Render cannot hand out a broken config.
func TestValidatorRefuses(t *testing.T) {
	s := kubeadmSpec()
	s.Files = append(s.Files, File{Path: "relative/x", Contents: []byte("x"), Mode: 0o600})
	if _, err := Render(s); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("relative path: %v", err)
	}
	s = kubeadmSpec()
	s.Files = append(s.Files, s.Files[0])
	if _, err := Render(s); err == nil {
		t.Fatal("a file written twice was accepted")
	}
}
