package render

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// The attacks of issue 33 on the renderer, written by someone who may edit
// a KubeadmConfig but is not meant to choose what the machine runs beyond
// the fields they set (an admission policy may allow files and users, not
// commands). Each is refused with an error naming the field, or the data
// cloud-init reads after Jinja (the real `cloud-init devel render`, then
// `cloud-init schema`) says exactly what the spec says: kubeadm and the
// success sentinel run, and nothing the attacker smuggled.

// evilCommand is what the attacks try to run.
const evilCommand = "touch /evil"

// injections try to end the value and write YAML of their own after Jinja.
var injections = []string{
	// An expression whose output ends a double-quoted or block scalar.
	`{{ "x\"\nruncmd: [[sh, -c, '` + evilCommand + `']]\nbootcmd: [[sh, -c, '` + evilCommand + `']]\n#" }}`,
	"{{ '\\n' ~ 'runcmd: [[sh, -c, \"" + evilCommand + "\"]]' ~ '\\n' }}",
	// A statement and a comment that swallow YAML or emit lines.
	"{% if true %}\nruncmd: [[sh, -c, '" + evilCommand + "']]\n{% endif %}",
	"{% raw %}a{% endraw %}{% endraw %}\nruncmd: [[sh, -c, '" + evilCommand + "']]",
	"{% set x = 'runcmd' %}{{ x }}",
	// Undefined at depth: cloud-init drops all user data.
	"{{ ds.no_such.key }}",
}

// renderedCloudConfig renders in and returns what cloud-init reads of it,
// or nil and the error when Render refuses.
func renderedCloudConfig(t *testing.T, in Input) (map[string]any, error) {
	t.Helper()
	data, err := Render(in)
	if err != nil {
		return nil, err
	}
	rendered := rendertest.CloudInitSchema(t, data)
	var cfg map[string]any
	if err := yaml.Unmarshal(rendered, &cfg); err != nil {
		t.Fatalf("cloud-init's rendered document is not YAML: %v\n%s", err, rendered)
	}
	return cfg, nil
}

// assertRunsOnlyTheSpec fails unless the rendered cloud-config runs the
// install script, kubeadm and the sentinel, and nothing with evilCommand
// except as the very value the spec gave.
func assertRunsOnlyTheSpec(t *testing.T, cfg map[string]any, value string) {
	t.Helper()
	runcmd, _ := cfg["runcmd"].([]any)
	var flat []string
	for _, c := range runcmd {
		argv, _ := c.([]any)
		var words []string
		for _, w := range argv {
			s, _ := w.(string)
			words = append(words, s)
		}
		flat = append(flat, strings.Join(words, " "))
	}
	if !slices.ContainsFunc(flat, func(c string) bool { return strings.HasPrefix(c, "kubeadm join") }) ||
		!slices.ContainsFunc(flat, func(c string) bool { return strings.Contains(c, sentinelPath) }) {
		t.Fatalf("value %q: runcmd lost kubeadm or the sentinel: %q", value, flat)
	}
	if _, ok := cfg["bootcmd"]; ok {
		t.Fatalf("value %q added bootcmd: %v", value, cfg["bootcmd"])
	}
	for _, c := range flat {
		if strings.Contains(c, evilCommand) && !strings.Contains(c, value) {
			t.Fatalf("value %q: runcmd runs %q", value, c)
		}
	}
}

// TestTemplatingCannotChangeStructure: a Jinja construct in a field the
// attacker controls never replaces runcmd or drops the user data.
func TestTemplatingCannotChangeStructure(t *testing.T) {
	t.Parallel()
	for _, v := range injections {
		for name, set := range map[string]func(s *bootstrapv1.KubeadmConfigSpec, in *Input){
			"file content": func(_ *bootstrapv1.KubeadmConfigSpec, in *Input) {
				in.Files = append(in.Files, File{Path: "/etc/x", Content: v})
			},
			"user gecos": func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) { s.Users[0].Gecos = v },
			"pre-command": func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
				s.PreKubeadmCommands = append(s.PreKubeadmCommands, v)
			},
			"kubeadm field": func(_ *bootstrapv1.KubeadmConfigSpec, in *Input) {
				in.KubeadmConfig = append(in.KubeadmConfig, []byte("x: '"+v+"'\n")...)
			},
		} {
			s := spec(bootstrapv1.FormatCloudConfig)
			s.BootCommands = nil
			in := input(s, RoleJoin)
			set(s, &in)
			cfg, err := renderedCloudConfig(t, in)
			if err != nil {
				continue // refused: nothing rendered
			}
			assertRunsOnlyTheSpec(t, cfg, v)
			if name == "user gecos" {
				users, _ := cfg["users"].([]any)
				if len(users) != 1 || users[0].(map[string]any)["gecos"] != v {
					t.Errorf("gecos %q reads back as %v", v, cfg["users"])
				}
			}
		}
	}
}

// TestReferenceOutputCannotChangeStructure: instance data holding quotes
// and line breaks, referenced from a command, a file and the kubeadm
// configuration, reaches each value whole and nothing else.
func TestReferenceOutputCannotChangeStructure(t *testing.T) {
	t.Parallel()
	hostile := "x\"\nruncmd: [[sh, -c, '" + evilCommand + "']]\n'\\\u2028\u0085\x7f😀{{ y }}"
	instance := []byte(`{"v1": {"local_hostname": "node-0"}, "ds": {"meta_data": {"local_hostname": "node-0", "hostile": ` + jsonString(hostile) + `}}}`)
	s := spec(bootstrapv1.FormatCloudConfig)
	s.BootCommands = nil
	s.PreKubeadmCommands = []string{"echo {{ ds.meta_data.hostile }}"}
	in := input(s, RoleJoin)
	in.Files = append(in.Files, File{Path: "/etc/hostile", Content: "a{{ds.meta_data['hostile']}}b\n"})
	data, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	rendered := rendertest.RenderJinja(t, data, instance)
	var cfg map[string]any
	if err := yaml.Unmarshal(rendered, &cfg); err != nil {
		t.Fatalf("the rendered cloud-config is not YAML: %v\n%s", err, rendered)
	}
	assertRunsOnlyTheSpec(t, cfg, hostile)
	var files []string
	for _, f := range cfg["write_files"].([]any) {
		if f := f.(map[string]any); f["path"] == "/etc/hostile" {
			files = append(files, f["content"].(string))
		}
	}
	if len(files) != 1 || files[0] != "a"+hostile+"b\n" {
		t.Fatalf("/etc/hostile holds %q, want %q", files, "a"+hostile+"b\n")
	}
	runcmd := cfg["runcmd"].([]any)
	if got := runcmd[2].([]any)[2]; got != "echo "+hostile {
		t.Fatalf("the command reads %q, want %q", got, "echo "+hostile)
	}
}

func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestValuesCheckedForTheirReader: a value that the program reading it on
// the machine would split (fstab, sudoers, authorized_keys, /etc/passwd,
// the shell script) is refused in both formats with an error naming the
// field.
func TestValuesCheckedForTheirReader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, field string
		set         func(s *bootstrapv1.KubeadmConfigSpec, in *Input)
	}{
		{"a line break in a mount point adds an fstab entry", "spec.mounts[0][1]", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Mounts = []cabpkv1.MountPoints{{"LABEL=etcd", "/var/lib/etcd\n/dev/evil\t/\text4"}}
		}},
		{"a space in mount options splits the fstab field", "spec.mounts[0][3]", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Mounts = []cabpkv1.MountPoints{{"LABEL=etcd", "/var/lib/etcd", "ext4", "defaults 0 0"}}
		}},
		{"a line break in a user name adds a sudoers rule", "spec.users[0].name", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Users[0].Name, s.Users[0].Sudo = "ops ALL=(ALL) NOPASSWD:ALL\nevil", "ALL=(ALL) ALL"
		}},
		{"a line break in an SSH key adds a key", "spec.users[0].sshAuthorizedKeys[0]", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Users[0].SSHAuthorizedKeys = []string{"ssh-ed25519 AAAA ops\nssh-ed25519 BBBB evil"}
		}},
		{"a colon in gecos adds a passwd field", "spec.users[0].gecos", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Users[0].Gecos = "Ops:0:0"
		}},
		{"a line break in a group list", "spec.users[0].groups", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Users[0].Groups = "wheel\nroot"
		}},
		{"a line break in a shell", "spec.users[0].shell", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.Users[0].Shell = "/bin/bash\nevil"
		}},
		{"a line separator in a file path", "spec.files[0].path", func(s *bootstrapv1.KubeadmConfigSpec, in *Input) {
			s.Files = []cabpkv1.File{{Path: "/etc/a\u2028b"}}
			in.Files = append([]File{{Path: "/etc/a\u2028b"}}, in.Files...)
		}},
		{"a line break in a file owner", "spec.files[0].owner", func(s *bootstrapv1.KubeadmConfigSpec, in *Input) {
			s.Files = []cabpkv1.File{{Path: "/etc/a", Owner: "root\nevil"}}
			in.Files = append([]File{{Path: "/etc/a", Owner: "root\nevil"}}, in.Files...)
		}},
		{"a NUL in a command", "spec.postKubeadmCommands[1]", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.PostKubeadmCommands = append(s.PostKubeadmCommands, "echo a\x00b")
		}},
		{"NEL in a file system label", "spec.diskSetup.filesystems[0].label", func(s *bootstrapv1.KubeadmConfigSpec, _ *Input) {
			s.DiskSetup.Filesystems[0].Label = "etcd\u0085x"
		}},
	} {
		for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
			s := spec(format)
			in := input(s, RoleJoin)
			tc.set(s, &in)
			_, err := Render(in)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%s, %s: %v, want a refusal naming %s", format, tc.name, err, tc.field)
			}
		}
	}
}
