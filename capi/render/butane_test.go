package render

import (
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// TestButaneAdditions: user additions in Butane are translated and merged
// over the rendered config; Butane that does not translate is an error
// naming Butane.
func TestButaneAdditions(t *testing.T) {
	s := spec(bootstrapv1.FormatIgnition)
	s.Ignition = &bootstrapv1.IgnitionSpec{AdditionalConfig: `variant: fcos
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
`}
	data, err := Render(input(s, RoleJoin))
	if err != nil {
		t.Fatal(err)
	}
	cfg := rendertest.Ignition(t, data)
	found := map[string]bool{}
	for _, f := range cfg.Storage.Files {
		found[f.Path] = true
	}
	for _, u := range cfg.Systemd.Units {
		found[u.Name] = true
	}
	if !found["/etc/motd"] || !found["extra.service"] || !found[commandsScriptPath] || !found[commandsUnitName] {
		t.Fatalf("merged config lacks the additions or the base: %v", found)
	}

	s.Ignition.AdditionalConfig = "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: relative/path\n"
	if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "Butane") {
		t.Fatalf("invalid Butane: %v", err)
	}
}

// TestValidatorRefuses: the library's validator catches what would fail at
// boot, so the renderer cannot hand out a broken config; a file written
// twice is refused before.
func TestValidatorRefuses(t *testing.T) {
	cfg := types.Config{Ignition: types.Ignition{Version: ignitionVersion}}
	if err := addFiles(&cfg, []File{{Path: "relative/x", Content: "x", Permissions: "0600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := finishIgnition(cfg); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("relative path: %v", err)
	}
	cfg = types.Config{Ignition: types.Ignition{Version: ignitionVersion}}
	f := File{Path: "/etc/x", Content: "x", Owner: "root:root", Permissions: "0600"}
	if err := addFiles(&cfg, []File{f, f}); err == nil || !strings.Contains(err.Error(), "written twice") {
		t.Fatalf("a file written twice: %v", err)
	}
	cfg.Systemd.Units = []types.Unit{{Name: commandsUnitName, Enabled: ptr.To(true), Contents: ptr.To(commandsUnit)}}
	if _, err := finishIgnition(cfg); err != nil {
		t.Fatalf("the commands unit: %v", err)
	}
}
