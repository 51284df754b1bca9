package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// The tests of this file check that each CABPK field reaches the data
// with its meaning, on the parsed cloud-config (after `cloud-init schema`)
// and the parsed Ignition config (after Ignition's validator).

// cloudConfig renders s as a join's cloud-config, checks it with
// `cloud-init schema` and returns it parsed.
func cloudConfig(t *testing.T, s *bootstrapv1.KubeadmConfigSpec) map[string]any {
	t.Helper()
	s.Format = bootstrapv1.FormatCloudConfig
	data, err := Render(input(s, RoleJoin))
	if err != nil {
		t.Fatal(err)
	}
	data = rendertest.CloudInitSchema(t, data)
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("parsing the cloud-config: %v", err)
	}
	return cfg
}

// ignitionConfig renders s as a join's Ignition config and returns it
// parsed by Ignition's validator, with the files it writes.
func ignitionConfig(t *testing.T, s *bootstrapv1.KubeadmConfigSpec) (types.Config, map[string][]byte) {
	t.Helper()
	s.Format = bootstrapv1.FormatIgnition
	data, err := Render(input(s, RoleJoin))
	if err != nil {
		t.Fatal(err)
	}
	return rendertest.Ignition(t, data), rendertest.Files(t, bootstrapv1.FormatIgnition, data)
}

// jsonValue is v as cloud-config's parsed YAML holds it.
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func assertEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %#v\nwant %#v", what, got, want)
	}
}

func usersSpec() *bootstrapv1.KubeadmConfigSpec {
	return &bootstrapv1.KubeadmConfigSpec{Users: []cabpkv1.User{
		{Name: "ops", Gecos: "Operations", Groups: "wheel, docker", HomeDir: "/home/operations", Inactive: ptr.To(true),
			Shell: "/bin/bash", Passwd: "$6$salt$hash", PrimaryGroup: "ops", LockPassword: ptr.To(false),
			Sudo: "ALL=(ALL) NOPASSWD:ALL", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA ops"}},
		{Name: "audit", LockPassword: ptr.To(true)},
	}}
}

// TestUsers: every field of a user reaches both formats (CABPK drops none
// in cloud-config; Ignition's users get what Ignition has fields for, sudo
// rules in sudoers.d and the password lock from the commands).
func TestUsers(t *testing.T) {
	t.Run("cloud-config", func(t *testing.T) {
		cfg := cloudConfig(t, usersSpec())
		assertEqual(t, "users", cfg["users"], jsonValue(t, []map[string]any{
			{"name": "ops", "gecos": "Operations", "groups": "wheel, docker", "homedir": "/home/operations", "inactive": "0",
				"shell": "/bin/bash", "passwd": "$6$salt$hash", "primary_group": "ops", "lock_passwd": false,
				"sudo": "ALL=(ALL) NOPASSWD:ALL", "ssh_authorized_keys": []string{"ssh-ed25519 AAAA ops"}},
			{"name": "audit", "lock_passwd": true},
		}))
	})
	t.Run("ignition", func(t *testing.T) {
		cfg, files := ignitionConfig(t, usersSpec())
		assertEqual(t, "users", cfg.Passwd.Users, []types.PasswdUser{
			{Name: "ops", Gecos: ptr.To("Operations"), Groups: []types.Group{"wheel", "docker"}, HomeDir: ptr.To("/home/operations"),
				Shell: ptr.To("/bin/bash"), PasswordHash: ptr.To("$6$salt$hash"), PrimaryGroup: ptr.To("ops"),
				SSHAuthorizedKeys: []types.SSHAuthorizedKey{"ssh-ed25519 AAAA ops"}},
			{Name: "audit"},
		})
		assertEqual(t, "sudoers", string(files[sudoersPath]), "ops ALL=(ALL) NOPASSWD:ALL\n")
		i := slices.IndexFunc(cfg.Storage.Files, func(f types.File) bool { return f.Path == sudoersPath })
		if mode := cfg.Storage.Files[i].Mode; mode == nil || *mode != 0o440 {
			t.Errorf("sudoers mode %v, want 0440", mode)
		}
		script := string(files[commandsScriptPath])
		for _, want := range []string{"'usermod' '--inactive' '0' 'ops'\n", "'usermod' '--lock' 'audit'\n"} {
			if !strings.Contains(script, want) {
				t.Errorf("the commands lack %q:\n%s", want, script)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, u := range []cabpkv1.User{
			{Name: "ops", Sudo: "ALL=(ALL) ALL\nroot ALL=(ALL) ALL"},
			{Name: "-o", LockPassword: ptr.To(true)},
			{Name: "a b", Sudo: "ALL=(ALL) ALL"},
		} {
			s := &bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition, Users: []cabpkv1.User{u}}
			if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "user") {
				t.Errorf("user %+v: %v, want a refusal", u, err)
			}
		}
		s := &bootstrapv1.KubeadmConfigSpec{Users: []cabpkv1.User{{Name: "ops",
			PasswdFrom: cabpkv1.PasswdSource{Secret: cabpkv1.SecretPasswdSource{Name: "s", Key: "k"}}}}}
		if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "passwdFrom") {
			t.Errorf("an unresolved passwdFrom rendered: %v", err)
		}
	})
}

// TestNTP: ntp.enabled reaches cloud-init as given (unset means enabled);
// false configures nothing in Ignition either.
func TestNTP(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ntp        cabpkv1.NTP
		cloud      map[string]any
		chronyConf string
	}{
		{"servers", cabpkv1.NTP{Servers: []string{"time.example.com"}},
			map[string]any{"servers": []any{"time.example.com"}}, "server time.example.com iburst\n"},
		{"disabled", cabpkv1.NTP{Enabled: ptr.To(false), Servers: []string{"time.example.com"}},
			map[string]any{"enabled": false, "servers": []any{"time.example.com"}}, ""},
		{"enabled with the image's servers", cabpkv1.NTP{Enabled: ptr.To(true)}, map[string]any{"enabled": true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertEqual(t, "ntp", cloudConfig(t, &bootstrapv1.KubeadmConfigSpec{NTP: tc.ntp})["ntp"], tc.cloud)
			_, files := ignitionConfig(t, &bootstrapv1.KubeadmConfigSpec{NTP: tc.ntp})
			assertEqual(t, "chrony configuration", string(files[chronyConfPath]), tc.chronyConf)
		})
	}
}

// unitSettings reads a unit's key=value lines.
func unitSettings(t *testing.T, cfg types.Config, name string) map[string]string {
	t.Helper()
	i := slices.IndexFunc(cfg.Systemd.Units, func(u types.Unit) bool { return u.Name == name })
	if i < 0 || cfg.Systemd.Units[i].Contents == nil {
		t.Fatalf("no unit %s among %v", name, cfg.Systemd.Units)
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(*cfg.Systemd.Units[i].Contents, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

func disksSpec() *bootstrapv1.KubeadmConfigSpec {
	return &bootstrapv1.KubeadmConfigSpec{
		DiskSetup: cabpkv1.DiskSetup{
			Partitions: []cabpkv1.Partition{{Device: "/dev/vdb", Layout: ptr.To(true), Overwrite: ptr.To(false), TableType: "gpt"}},
			Filesystems: []cabpkv1.Filesystem{
				{Device: "/dev/vdb", Filesystem: "ext4", Label: "etcd", Partition: "auto", Overwrite: ptr.To(true), ExtraOpts: []string{"-E", "lazy_itable_init=1"}},
				{Device: "/dev/vdd", Filesystem: "xfs", Label: "data", Partition: "none", ReplaceFS: "ntfs"},
			},
		},
		Mounts: []cabpkv1.MountPoints{
			{"LABEL=etcd", "/var/lib/etcd", "ext4", "defaults,noatime"},
			{"data", "/var/lib/data"},                            // a label alone, as CAPZ's templates write it
			{"/dev/vde1", "/mnt/scratch-disk", "auto", "nofail"}, // no file system of this data's
			{"/dev/vdc2", "none", "swap", "sw"},
		},
	}
}

// TestDisks: partitions, every file system option and every mount reach
// both formats: cloud-init's disk_setup, fs_setup and mounts as CABPK
// writes them; Ignition's disks and file systems, and a unit per mount
// with its options, also for mounts of no file system of this data; a
// mount naming a file system by its label alone gets that file system's
// device, as CABPK's Ignition resolves it.
func TestDisks(t *testing.T) {
	t.Run("cloud-config", func(t *testing.T) {
		s := disksSpec()
		s.DiskSetup.Partitions = append(s.DiskSetup.Partitions, cabpkv1.Partition{Device: "/dev/vdc", TableType: "mbr",
			DiskLayout: []cabpkv1.PartitionSpec{{Percentage: 60}, {Percentage: 40, PartitionType: cabpkv1.PartitionTypeLinuxSwap}}})
		cfg := cloudConfig(t, s)
		assertEqual(t, "disk_setup", cfg["disk_setup"], jsonValue(t, map[string]any{
			"/dev/vdb": map[string]any{"table_type": "gpt", "layout": true, "overwrite": false},
			"/dev/vdc": map[string]any{"table_type": "mbr", "layout": []any{60, []any{40, 82}}},
		}))
		assertEqual(t, "fs_setup", cfg["fs_setup"], jsonValue(t, []map[string]any{
			{"device": "/dev/vdb", "filesystem": "ext4", "label": "etcd", "partition": "auto", "overwrite": true, "extra_opts": []string{"-E", "lazy_itable_init=1"}},
			{"device": "/dev/vdd", "filesystem": "xfs", "label": "data", "partition": "none", "replace_fs": "ntfs"},
		}))
		assertEqual(t, "mounts", cfg["mounts"], jsonValue(t, s.Mounts))
	})
	t.Run("ignition", func(t *testing.T) {
		cfg, _ := ignitionConfig(t, disksSpec())
		assertEqual(t, "disks", cfg.Storage.Disks, []types.Disk{{Device: "/dev/vdb", WipeTable: ptr.To(false), Partitions: []types.Partition{{Number: 1}}}})
		assertEqual(t, "filesystems", cfg.Storage.Filesystems, []types.Filesystem{
			{Device: "/dev/vdb1", Format: ptr.To("ext4"), Label: ptr.To("etcd"), WipeFilesystem: ptr.To(true), Options: []types.FilesystemOption{"-E", "lazy_itable_init=1"}},
			{Device: "/dev/vdd", Format: ptr.To("xfs"), Label: ptr.To("data"), WipeFilesystem: ptr.To(true)},
		})
		for name, want := range map[string]map[string]string{
			"var-lib-etcd.mount":        {"What": "/dev/disk/by-label/etcd", "Where": "/var/lib/etcd", "Type": "ext4", "Options": "defaults,noatime", "RequiredBy": "local-fs.target"},
			"var-lib-data.mount":        {"What": "/dev/vdd", "Where": "/var/lib/data", "Type": "xfs", "RequiredBy": "local-fs.target"},
			`mnt-scratch\x2ddisk.mount`: {"What": "/dev/vde1", "Where": "/mnt/scratch-disk", "Options": "nofail", "WantedBy": "local-fs.target"},
			"dev-vdc2.swap":             {"What": "/dev/vdc2", "Options": "sw", "WantedBy": "swap.target"},
		} {
			assertEqual(t, name, unitSettings(t, cfg, name), want)
		}
	})
	t.Run("ignition refuses what it cannot do", func(t *testing.T) {
		for name, edit := range map[string]func(*bootstrapv1.KubeadmConfigSpec){
			"percentages": func(s *bootstrapv1.KubeadmConfigSpec) {
				s.DiskSetup.Partitions[0] = cabpkv1.Partition{Device: "/dev/vdb", DiskLayout: []cabpkv1.PartitionSpec{{Percentage: 100}}}
			},
			"mbr":                func(s *bootstrapv1.KubeadmConfigSpec) { s.DiskSetup.Partitions[0].TableType = "mbr" },
			"datasource alias":   func(s *bootstrapv1.KubeadmConfigSpec) { s.Mounts[0][0] = "ephemeral0" },
			"no mount point":     func(s *bootstrapv1.KubeadmConfigSpec) { s.Mounts[0] = cabpkv1.MountPoints{"/dev/vdb"} },
			"relative":           func(s *bootstrapv1.KubeadmConfigSpec) { s.Mounts[0][1] = "var/lib/etcd" },
			"unknown partition":  func(s *bootstrapv1.KubeadmConfigSpec) { s.DiskSetup.Filesystems[0].Partition = "first" },
			"two-line option":    func(s *bootstrapv1.KubeadmConfigSpec) { s.Mounts[0][3] = "defaults\nExecStartPre=/bin/evil" },
			"trailing backslash": func(s *bootstrapv1.KubeadmConfigSpec) { s.Mounts[0][0] = `/dev/vdb\` },
		} {
			s := disksSpec()
			edit(s)
			s.Format = bootstrapv1.FormatIgnition
			if _, err := Render(input(s, RoleJoin)); err == nil {
				t.Errorf("%s: rendered", name)
			}
		}
	})
}

func TestPartitionPath(t *testing.T) {
	for dev, want := range map[string]string{"/dev/vdb": "/dev/vdb2", "/dev/nvme0n1": "/dev/nvme0n1p2", "/dev/disk/by-id/virtio-data": "/dev/disk/by-id/virtio-data-part2"} {
		assertEqual(t, dev, partitionPath(dev, "2"), want)
	}
	for p, want := range map[string]string{"/": "-", "/var/lib/etcd": "var-lib-etcd", "/mnt/a-b": `mnt-a\x2db`, "/srv/.hidden": "srv-.hidden", "/.x": `\x2ex`, "/mnt/scratch disk": `mnt-scratch\x20disk`, "/dev/vdc2": "dev-vdc2"} {
		assertEqual(t, p, escapePath(p), want)
	}
}

func gzipBase64(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestFiles: append adds to the machine's file (or the data's earlier one)
// instead of replacing it, and gzip stays compressed in both formats.
func TestFiles(t *testing.T) {
	big := strings.Repeat(`{"key": "value"}`, 1000)
	packed := gzipBase64(t, big)
	files := []File{
		{Path: "/etc/hosts", Content: "10.0.0.5 registry.example\n", Append: true},
		{Path: "/etc/motd", Content: "first\n", Permissions: "0600"},
		{Path: "/etc/motd", Content: "second\n", Append: true},
		{Path: "/opt/big.json", Content: packed, Encoding: EncodingGzipBase64},
		{Path: "/etc/plain.conf", Content: strings.Repeat("option = value\n", 100)},
	}
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		in := input(&bootstrapv1.KubeadmConfigSpec{Format: format}, RoleJoin)
		in.Files = files
		data, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > len(big)/2 {
			t.Errorf("%s: %d bytes of data, the gzip file was not kept compressed", format, len(data))
		}
		got := rendertest.Files(t, format, data)
		assertEqual(t, string(format)+" /opt/big.json", string(got["/opt/big.json"]), big)
		assertEqual(t, string(format)+" /etc/motd", string(got["/etc/motd"]), "first\nsecond\n")
		if format == bootstrapv1.FormatCloudConfig {
			var cfg struct {
				WriteFiles []map[string]any `json:"write_files"`
			}
			if err := yaml.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "write_files[0]", cfg.WriteFiles[0], map[string]any{"path": "/etc/hosts", "content": "10.0.0.5 registry.example\n", "append": true})
			assertEqual(t, "write_files[3]", cfg.WriteFiles[3], map[string]any{"path": "/opt/big.json", "content": packed, "encoding": "gz+b64"})
			continue
		}
		cfg := rendertest.Ignition(t, data)
		byPath := map[string]types.File{}
		for _, f := range cfg.Storage.Files {
			byPath[f.Path] = f
		}
		hosts := byPath["/etc/hosts"]
		if ptr.Deref(hosts.Overwrite, false) || hosts.Contents.Source != nil || len(hosts.Append) != 1 || hosts.Mode != nil {
			t.Errorf("/etc/hosts is not appended to: %+v", hosts)
		}
		if motd := byPath["/etc/motd"]; len(motd.Append) != 1 || ptr.Deref(motd.Mode, 0) != 0o600 {
			t.Errorf("/etc/motd: %+v", motd)
		}
		if c := byPath["/opt/big.json"].Contents.Compression; ptr.Deref(c, "") != "gzip" {
			t.Errorf("/opt/big.json compression %v", c)
		}
		// Ignition data compresses what gzip makes smaller.
		if c := byPath["/etc/plain.conf"].Contents.Compression; ptr.Deref(c, "") != "gzip" {
			t.Errorf("/etc/plain.conf compression %v", c)
		}
		assertEqual(t, "/etc/plain.conf", string(got["/etc/plain.conf"]), strings.Repeat("option = value\n", 100))
	}
}

// TestJinja: cloud-config is a Jinja template, so instance metadata in the
// kubeadm configuration, files and commands expands when cloud-init
// renders it (checked with the real `cloud-init devel render`); a document
// Jinja cannot parse is refused at render time instead of at boot.
func TestJinja(t *testing.T) {
	s := &bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, PreKubeadmCommands: []string{
		"hostnamectl set-hostname {{ ds.meta_data.local_hostname }}",
		// Not at the end of the line: cloud-init's Jinja drops the newline
		// after a block tag (trim_blocks).
		"echo {% raw %}${#PATH}{% endraw %} characters",
	}}
	in := input(s, RoleJoin)
	in.KubeadmConfig = []byte("apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\nnodeRegistration:\n  name: '{{ ds.meta_data.local_hostname }}'\n")
	in.Files = append(in.Files, File{Path: "/etc/node-name", Content: "{{ v1.local_hostname }}\n"})
	data, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), jinjaHeader+"#cloud-config\n") {
		t.Fatalf("the data does not start with the Jinja header:\n%s", data)
	}
	rendertest.CloudInitSchema(t, data)
	rendered := rendertest.RenderJinja(t, data, []byte(`{"v1": {"local_hostname": "node-7"}, "ds": {"meta_data": {"local_hostname": "node-7"}}}`))
	var cfg struct {
		RunCmd     [][]string                       `json:"runcmd"`
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal(rendered, &cfg); err != nil {
		t.Fatalf("parsing the rendered cloud-config: %v\n%s", err, rendered)
	}
	files := map[string]string{}
	for _, f := range cfg.WriteFiles {
		files[f.Path] = f.Content
	}
	if !strings.Contains(files[KubeadmConfigPath], "name: 'node-7'\n") || files["/etc/node-name"] != "node-7\n" {
		t.Errorf("instance metadata did not expand: kubeadm config %q, /etc/node-name %q", files[KubeadmConfigPath], files["/etc/node-name"])
	}
	if !slices.ContainsFunc(cfg.RunCmd, func(c []string) bool { return slices.Contains(c, "hostnamectl set-hostname node-7") }) ||
		!slices.ContainsFunc(cfg.RunCmd, func(c []string) bool { return slices.Contains(c, "echo ${#PATH} characters") }) {
		t.Errorf("commands after rendering: %q", cfg.RunCmd)
	}

	for _, bad := range []string{"echo ${#PATH}", "echo {{ unclosed", "{% raw %} never closed", "{% if x %}a block closed elsewhere",
		"echo 'a' {% if true %}b{% endif %}", "{{- 'strips into the YAML' }}", "{{ x -}}", "a {# c #}\nb"} {
		s := &bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, PostKubeadmCommands: []string{bad}}
		if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "Jinja") {
			t.Errorf("%q: %v, want a refusal naming Jinja", bad, err)
		}
	}
}

// TestIgnitionKubeadmConfigUnderEtc: Ignition writes the kubeadm
// configuration where CABPK's Ignition does, under /etc: Ignition writes
// from the initramfs, and nothing it writes under /run survives.
func TestIgnitionKubeadmConfigUnderEtc(t *testing.T) {
	cfg, files := ignitionConfig(t, spec(bootstrapv1.FormatIgnition))
	for _, f := range cfg.Storage.Files {
		if strings.HasPrefix(f.Path, "/run/") {
			t.Errorf("Ignition writes %s, which does not survive", f.Path)
		}
	}
	if !strings.Contains(string(files[IgnitionKubeadmConfigPath]), "kind: JoinConfiguration") {
		t.Fatalf("no kubeadm configuration at %s", IgnitionKubeadmConfigPath)
	}
	if script := string(files[commandsScriptPath]); !strings.Contains(script, "'kubeadm' 'join' '--config' '"+IgnitionKubeadmConfigPath+"'") {
		t.Errorf("kubeadm does not read %s:\n%s", IgnitionKubeadmConfigPath, script)
	}
}
