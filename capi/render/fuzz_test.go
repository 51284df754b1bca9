package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapdata/cloudinit"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapdata/ignition"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// The fuzz targets: any spec, in any role, either renders data that is
// valid in its format and says exactly what the spec says, or Render
// returns an error; never a panic.
//
//   - cloud-config: cloud-init renders the Jinja and accepts the result
//     (`cloud-init devel render` and `cloud-init schema`: the command line
//     for each seed, cloud-init's own modules in one long-running Python
//     while fuzzing), and reads it as the spec's values: exactly the spec's
//     files, users, commands, NTP, disks and mounts, each value as Jinja
//     renders it alone, nothing added; the YAML before Jinja holds every
//     value exactly.
//   - Ignition: coreos/ignition's validator accepts it; its files, users,
//     units, commands script, sudoers and chrony files are exactly the
//     spec's; every file decodes.
//   - attested mode, in both formats: the same, and the environment file
//     is one plain assignment of the expected arguments.
//
// `go test` runs the seeds below and testdata/fuzz/<target>/ (every bug the
// fuzzer found, fixed); `go test -run='^$' -fuzz=FuzzRenderCloudConfig
// -fuzztime=5m ./capi/render/` fuzzes (docs/capi.md, "Fuzzing").

func FuzzRenderCloudConfig(f *testing.F) { fuzzRender(f, targetCloudConfig) }

func FuzzRenderIgnition(f *testing.F) { fuzzRender(f, targetIgnition) }

func FuzzRenderAttested(f *testing.F) { fuzzRender(f, targetAttested) }

// seedSpecs are specs as users write them (as test/capiparity's samples),
// together using every field Render reads; the generator reaches every
// field of KubeadmConfigSpec from them.
var seedSpecs = []string{
	`{}`,
	`
clusterConfiguration:
  controlPlaneEndpoint: apiserver.example.com:6443
  apiServer:
    extraArgs: [{name: audit-log-maxage, value: "30"}]
    certSANs: [apiserver.example.com]
  controllerManager: {extraArgs: [{name: bind-address, value: 0.0.0.0}]}
  etcd: {local: {dataDir: /var/lib/etcddisk/etcd}}
initConfiguration:
  nodeRegistration:
    name: '{{ ds.meta_data.local_hostname }}'
    kubeletExtraArgs: [{name: node-labels, value: tier=control-plane}]
joinConfiguration:
  nodeRegistration:
    kubeletExtraArgs: [{name: cloud-provider, value: external}]
verbosity: 5
architecture: arm64
`,
	`
files:
- {path: /etc/motd, content: "managed by Cluster API\n", owner: "root:adm", permissions: "0640"}
- {path: /etc/kubernetes/audit-policy.yaml, encoding: base64, content: YXBpVmVyc2lvbjogYXVkaXQuazhzLmlvL3YxCg==}
- {path: /etc/sysctl.d/90-kubernetes.conf, encoding: gzip+base64, content: "` + gzipBase64Of("net.ipv4.ip_forward = 1\n") + `"}
- {path: /etc/hosts, append: true, content: "10.0.0.10 registry.example\n"}
- {path: /etc/kubernetes/encryption.yaml, permissions: "0600", contentFrom: {secret: {name: files, key: encryption.yaml}}}
- {path: /etc/cluster-info, contentFormat: Template, content: "{{ .controlPlane.version }}\n"}
`,
	`
users:
- name: ops
  gecos: Operations
  groups: wheel, docker
  homeDir: /home/operations
  inactive: true
  shell: /bin/bash
  passwd: $6$salt$hash
  primaryGroup: ops
  lockPassword: false
  sudo: ALL=(ALL) NOPASSWD:ALL
  sshAuthorizedKeys: [ssh-ed25519 AAAA ops]
- {name: audit, lockPassword: true, passwdFrom: {secret: {name: users, key: audit}}}
ntp: {enabled: true, servers: [time.example.com, 10.0.0.1]}
`,
	`
diskSetup:
  partitions:
  - {device: /dev/vdb, layout: true, overwrite: false, tableType: gpt}
  - {device: /dev/vdc, tableType: mbr, diskLayout: [{percentage: 70, partitionType: Linux}, {percentage: 30, partitionType: LinuxSwap}]}
  filesystems:
  - {device: /dev/vdb, partition: auto, filesystem: ext4, label: etcd_disk, overwrite: true, replaceFS: ntfs, extraOpts: ["-E", "lazy_itable_init=1"]}
  - {device: /dev/vdd, partition: none, filesystem: xfs, label: data}
mounts:
- [LABEL=etcd_disk, /var/lib/etcddisk]
- [data, /var/lib/data]
- [/dev/vde1, /mnt/scratch-disk, auto, "nofail,x-systemd.description=%n"]
- [/dev/vdc2, none, swap, sw]
`,
	`
bootCommands: [echo boot > /run/boot-marker]
preKubeadmCommands: [swapoff -a, "sed -i '/ swap / s/^/#/' /etc/fstab", "hostnamectl set-hostname {{ ds.meta_data.local_hostname }}"]
postKubeadmCommands: ["echo {% raw %}${#PATH}{% endraw %} characters", "echo 'done: \"yes\"'"]
`,
	`
ignition:
  additionalConfig: |
    variant: fcos
    version: 1.6.0
    systemd:
      units:
      - name: chronyd.service
        enabled: true
`,
	`
attested: {enabled: true, joinEndpoints: ["10.0.0.10:9090", "[2001:db8::1]:9090", "join.example.com:443"]}
users: [{name: ops, sudo: "ALL=(ALL) ALL"}]
mounts: [[/dev/vdb, /var/lib/etcd, ext4]]
`,
}

// seedChoices drive the generator from the seed specs, in turn: a join, an
// init, a control plane's join and an init in Ignition (attested mode's
// format choice). The fuzzer finds the hostile edits. One each keeps the
// seeds' cloud-init command lines within seconds.
var seedChoices = []string{"", "\x01", "\x00\x01", "\x01\x00\x00\x01"}

func fuzzRender(f *testing.F, target fuzzTarget) {
	for i, s := range seedSpecs {
		f.Add([]byte(s), []byte(seedChoices[i%len(seedChoices)]))
	}
	if dir := os.Getenv("GATEHOUSE_RENDER_FUZZ_CORPUS"); dir != "" {
		// Every input a fuzzing run kept (the fuzz cache,
		// $(go env GOCACHE)/fuzz/<package>), checked as seeds are: with
		// cloud-init's command lines.
		addCorpus(f, filepath.Join(dir, f.Name()))
	}
	seeding := !fuzzing()
	f.Fuzz(func(t *testing.T, specYAML, choiceBytes []byte) {
		in, ok := fuzzInput(specYAML, choiceBytes, target)
		if !ok {
			return
		}
		if seeding {
			// The seeds run the real command lines, a few processes each.
			t.Parallel()
		}
		data, err := Render(in)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("Render failed without saying why")
			}
			return
		}
		format := in.Spec.Format
		if format == bootstrapv1.FormatIgnition {
			checkIgnition(t, in, data)
		} else {
			checkCloudConfig(t, in, data, seeding)
		}
		if in.Spec.Attested != nil && in.Spec.Attested.Enabled {
			checkAttested(t, in, format, data)
		}
	})
}

// addCorpus adds the inputs of a fuzz corpus directory as seeds.
func addCorpus(f *testing.F, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 || lines[0] != "go test fuzz v1" {
			f.Fatalf("%s is not a corpus file of two []byte", e.Name())
		}
		var args [2][]byte
		for i, l := range lines[1:] {
			v, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(l, "[]byte("), ")"))
			if err != nil {
				f.Fatalf("%s: %v", e.Name(), err)
			}
			args[i] = []byte(v)
		}
		f.Add(args[0], args[1])
	}
}

// fuzzing says the test binary runs with -fuzz, as the fuzzing engine's
// coordinator or one of its workers.
func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if fl := flag.Lookup(name); fl != nil && fl.Value.String() != "" && fl.Value.String() != "false" {
			return true
		}
	}
	return false
}

var cloudInit struct {
	once sync.Once
	ci   *rendertest.CloudInit
	err  error
}

// cloudInitChecker is this process's long-running cloud-init; it lives as
// long as the test binary.
func cloudInitChecker(t *testing.T) *rendertest.CloudInit {
	t.Helper()
	cloudInit.once.Do(func() { cloudInit.ci, cloudInit.err = rendertest.StartCloudInit() })
	if cloudInit.err != nil {
		t.Fatal(cloudInit.err)
	}
	return cloudInit.ci
}

// hasJinja says s opens a Jinja delimiter.
func hasJinja(s string) bool {
	return strings.Contains(s, "{{") || strings.Contains(s, "{%") || strings.Contains(s, "{#")
}

// templateValues calls fn with each value of a cloud-config (JSON-shaped)
// that cloud-init's Jinja renders as a template: the contents of files
// without an encoding and the commands' arguments (cloudinit.RenderJinja).
// fn's result replaces the value.
func templateValues(doc any, fn func(string) string) {
	m, _ := doc.(map[string]any)
	if files, ok := m["write_files"].([]any); ok {
		for _, f := range files {
			if f := f.(map[string]any); f["encoding"] == nil {
				f["content"] = fn(f["content"].(string))
			}
		}
	}
	for _, key := range []string{"bootcmd", "runcmd"} {
		cmds, _ := m[key].([]any)
		for _, c := range cmds {
			argv := c.([]any)
			for i, a := range argv {
				argv[i] = fn(a.(string))
			}
		}
	}
}

// checkCloudConfig: cloud-init renders the Jinja, accepts the result and
// reads exactly the expected values: every value as the spec has it, but
// a template value (a file's content, a command) with each of its
// references to instance data replaced by what cloud-init's Jinja makes of
// that reference alone. No value, whatever it holds, may change the
// document's structure or another value.
func checkCloudConfig(t *testing.T, in Input, data []byte, seeding bool) {
	t.Helper()
	if !bytes.HasPrefix(data, []byte(JinjaHeader+"#cloud-config\n")) {
		t.Fatalf("the data does not start with %q:\n%s", JinjaHeader+"#cloud-config", data)
	}
	want := expectedCloudConfig(in)
	var refs []string
	templateValues(want, func(s string) string {
		if !hasJinja(s) {
			return s
		}
		parts, err := cloudinit.ParseTemplate(s)
		if err != nil {
			t.Fatalf("the data renders %q, which is no template of references and raw text: %v", s, err)
		}
		for _, p := range parts {
			if p.Ref != nil && !slices.Contains(refs, cloudinit.RefExpr(p.Ref)) {
				refs = append(refs, cloudinit.RefExpr(p.Ref))
			}
		}
		return s
	})
	res, err := cloudInitChecker(t).Check(data, nil, refs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != "" && !partitionNumbers.MatchString(res.Error) {
		t.Fatalf("cloud-init refuses the data: %s\n%s", res.Error, data)
	}
	for _, r := range refs {
		if res.Refs[r].Error != "" {
			t.Fatalf("cloud-init's Jinja cannot render the reference %s: %s", r, res.Refs[r].Error)
		}
	}
	templateValues(want, func(s string) string {
		if !hasJinja(s) {
			return s
		}
		parts, _ := cloudinit.ParseTemplate(s)
		var b strings.Builder
		for _, p := range parts {
			if p.Ref != nil {
				b.WriteString(res.Refs[cloudinit.RefExpr(p.Ref)].Rendered)
			} else {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	})
	// The files decode as cloud-init decodes them.
	for _, f := range want.(map[string]any)["write_files"].([]any) {
		f := f.(map[string]any)
		if enc, _ := f["encoding"].(string); enc != "" {
			b, err := base64.StdEncoding.DecodeString(f["content"].(string))
			if err != nil {
				t.Fatalf("file %v: %s content is not base64: %v", f["path"], enc, err)
			}
			if enc == "gz+b64" {
				gunzipBytes(t, fmt.Sprint(f["path"]), b)
			}
		}
	}
	if res.Error != "" {
		return // the schema gaps below; the values were read by YAML alone
	}
	if !reflect.DeepEqual(res.Config, want) {
		t.Fatalf("cloud-init does not read exactly the spec's values: %s\n%s", jsonDiff("", res.Config, want), data)
	}
	if seeding {
		// The command lines themselves: `cloud-init devel render`, then
		// `cloud-init schema`, read the same document.
		rendered := rendertest.CloudInitSchema(t, data)
		var got any
		if err := yaml.Unmarshal(rendered, &got); err != nil {
			t.Fatalf("the rendered cloud-config is not YAML: %v\n%s", err, rendered)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("`cloud-init devel render` does not give exactly the spec's values: %s\n%s", jsonDiff("", got, want), rendered)
		}
	}
}

// partitionNumbers are the errors of Debian's cloud-init 22.4 schema that
// the data may have: it takes no file system partition number and only
// decimal partition types, which cloud-init's cc_disk_setup reads (and
// hands to sfdisk as hex text: LinuxRAID is "fd", as CABPK writes it).
var partitionNumbers = regexp.MustCompile(`(?s)^SchemaValidationError: Cloud config schema errors: (` + schemaGap + `)(, (` + schemaGap + `))*( Cloud config schema deprecations:.*)?$`)

const schemaGap = `fs_setup\.[0-9]+\.partition: [0-9]+ is not valid under any of the given schemas|` +
	`disk_setup\..+?\.layout: \[.*?'.*?\] is not valid under any of the given schemas`

// jsonDiff names the first place where two JSON-shaped values differ.
func jsonDiff(at string, got, want any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			break
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				return fmt.Sprintf("%s.%s: unexpected %s", at, k, js(g[k]))
			}
		}
		for k := range w {
			if !reflect.DeepEqual(g[k], w[k]) {
				return jsonDiff(at+"."+k, g[k], w[k])
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			break
		}
		for i := range w {
			if !reflect.DeepEqual(g[i], w[i]) {
				return jsonDiff(fmt.Sprintf("%s[%d]", at, i), g[i], w[i])
			}
		}
	}
	return fmt.Sprintf("%s: got %.300s, want %.300s", at, js(got), js(want))
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// jsonShaped is v as encoding/json reads it back.
func jsonShaped(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// commands are the commands, in order, that the data runs for the spec
// after the boot commands: the install script, the pre-kubeadm commands,
// kubeadm or the bootstrapper, the post-kubeadm commands, the sentinel.
func expectedCommands(in Input) [][]string {
	spec := in.Spec
	attested := spec.Attested != nil && spec.Attested.Enabled
	var cmds [][]string
	if !attested {
		cmds = append(cmds, []string{InstallScriptPath})
	}
	for _, c := range spec.PreKubeadmCommands {
		cmds = append(cmds, []string{"/bin/sh", "-c", c})
	}
	if attested {
		cmds = append(cmds, []string{"systemctl", "enable", "--now", BootstrapperUnit})
	} else {
		kubeadm := []string{"kubeadm", string(in.Role), "--config", KubeadmConfigPathFor(spec.Format)}
		if spec.Verbosity != nil {
			kubeadm = append(kubeadm, "--v", strconv.Itoa(int(*spec.Verbosity)))
		}
		cmds = append(cmds, kubeadm)
	}
	for _, c := range spec.PostKubeadmCommands {
		cmds = append(cmds, []string{"/bin/sh", "-c", c})
	}
	if !attested {
		cmds = append(cmds, []string{"/bin/sh", "-c", "mkdir -p /run/cluster-api && echo success > " + SentinelPath})
	}
	return cmds
}

// expectedCloudConfig is the cloud-config the spec means, written
// independently of the renderer's mapping (as CABPK's cloud-config maps
// each field); the files the renderer adds are taken as rendered.
func expectedCloudConfig(in Input) any {
	spec := in.Spec
	attested := spec.Attested != nil && spec.Attested.Enabled
	doc := map[string]any{}
	var files []map[string]any
	for _, f := range in.Files {
		m := map[string]any{"path": f.Path, "content": f.Content}
		if enc := map[Encoding]string{EncodingBase64: "b64", EncodingGzipBase64: "gz+b64"}[f.Encoding]; enc != "" {
			m["encoding"] = enc
		}
		if f.Owner != "" {
			m["owner"] = f.Owner
		}
		if f.Permissions != "" {
			m["permissions"] = f.Permissions
		}
		if f.Append {
			m["append"] = true
		}
		files = append(files, m)
	}
	if !attested {
		components, _ := baseTemplate(in.KubernetesVersion, in.Arch)
		files = append(files, map[string]any{"path": InstallScriptPath, "content": installScript(components), "permissions": "0700"})
		files = append(files, map[string]any{"path": KubeadmConfigPath, "content": string(in.KubeadmConfig), "owner": "root:root", "permissions": "0640"})
	} else {
		env, _ := bootstrapperEnv(in)
		files = append(files, map[string]any{"path": BootstrapperEnvPath, "content": env, "permissions": "0644"})
	}
	doc["write_files"] = files
	var boot [][]string
	for _, c := range spec.BootCommands {
		boot = append(boot, []string{"/bin/sh", "-c", c})
	}
	if len(boot) > 0 {
		doc["bootcmd"] = boot
	}
	doc["runcmd"] = append([][]string{{"set", "-e"}}, expectedCommands(in)...)
	var users []map[string]any
	for _, u := range spec.Users {
		m := map[string]any{"name": u.Name}
		for k, v := range map[string]string{"gecos": u.Gecos, "groups": u.Groups, "homedir": u.HomeDir, "shell": u.Shell,
			"passwd": u.Passwd, "primary_group": u.PrimaryGroup, "sudo": u.Sudo} {
			if v != "" {
				m[k] = v
			}
		}
		if u.LockPassword != nil {
			m["lock_passwd"] = *u.LockPassword
		}
		if ptr.Deref(u.Inactive, false) {
			m["inactive"] = "0"
		}
		if len(u.SSHAuthorizedKeys) > 0 {
			m["ssh_authorized_keys"] = u.SSHAuthorizedKeys
		}
		users = append(users, m)
	}
	if len(users) > 0 {
		doc["users"] = users
	}
	if spec.NTP.Enabled != nil || len(spec.NTP.Servers) > 0 {
		ntp := map[string]any{}
		if spec.NTP.Enabled != nil {
			ntp["enabled"] = *spec.NTP.Enabled
		}
		if len(spec.NTP.Servers) > 0 {
			ntp["servers"] = spec.NTP.Servers
		}
		doc["ntp"] = ntp
	}
	disks := map[string]any{}
	for _, p := range spec.DiskSetup.Partitions {
		m := map[string]any{}
		if p.TableType != "" {
			m["table_type"] = p.TableType
		}
		if p.Overwrite != nil {
			m["overwrite"] = *p.Overwrite
		}
		if len(p.DiskLayout) > 0 {
			var layout []any
			for _, part := range p.DiskLayout {
				code, ok := map[string]any{cabpkv1.PartitionTypeLinux: 83, cabpkv1.PartitionTypeLinuxSwap: 82, cabpkv1.PartitionTypeLinuxRAID: "fd",
					cabpkv1.PartitionTypeLVM: "8e", cabpkv1.PartitionTypeFat32: "0c", cabpkv1.PartitionTypeNTFS: 7,
					cabpkv1.PartitionTypeLinuxExtended: 85}[part.PartitionType]
				switch {
				case part.PartitionType == "":
					layout = append(layout, part.Percentage)
				case ok:
					layout = append(layout, []any{part.Percentage, code})
				default:
					layout = append(layout, []any{part.Percentage, part.PartitionType})
				}
			}
			m["layout"] = layout
		} else if p.Layout != nil {
			m["layout"] = *p.Layout
		}
		disks[p.Device] = m
	}
	if len(disks) > 0 {
		doc["disk_setup"] = disks
	}
	var fss []map[string]any
	for _, fs := range spec.DiskSetup.Filesystems {
		m := map[string]any{"filesystem": fs.Filesystem, "device": fs.Device}
		for k, v := range map[string]string{"label": fs.Label, "partition": fs.Partition, "replace_fs": fs.ReplaceFS} {
			if v != "" {
				m[k] = v
			}
		}
		if n, err := strconv.Atoi(fs.Partition); err == nil {
			m["partition"] = n
		}
		if fs.Overwrite != nil {
			m["overwrite"] = *fs.Overwrite
		}
		if len(fs.ExtraOpts) > 0 {
			m["extra_opts"] = fs.ExtraOpts
		}
		fss = append(fss, m)
	}
	if len(fss) > 0 {
		doc["fs_setup"] = fss
	}
	if len(spec.Mounts) > 0 {
		mounts := make([][]string, len(spec.Mounts))
		for i, m := range spec.Mounts {
			mounts[i] = append([]string{}, m...)
		}
		doc["mounts"] = mounts
	}
	return jsonShaped(doc)
}

// checkIgnition: Ignition's validator accepts the data, and the config
// holds exactly the spec's files (each decoding to its content), users,
// units, commands, sudo rules and NTP servers, and nothing else; with
// Butane additions, which may add and replace anything, only validity and
// decoding are checked.
func checkIgnition(t *testing.T, in Input, data []byte) {
	t.Helper()
	cfg := rendertest.Ignition(t, data)
	files := rendertest.Files(t, bootstrapv1.FormatIgnition, data)
	spec := in.Spec
	if spec.Ignition != nil && strings.TrimSpace(spec.Ignition.AdditionalConfig) != "" {
		return
	}
	attested := spec.Attested != nil && spec.Attested.Enabled

	// Files: the spec's, in order (appends to a path merged), then the
	// renderer's.
	var paths []string
	want := map[string][]byte{}
	for _, f := range in.Files {
		b := []byte(f.Content)
		if f.Encoding != EncodingNone {
			var err error
			if b, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				t.Fatalf("file %s rendered though its content is not base64", f.Path)
			}
			if f.Encoding == EncodingGzipBase64 {
				b = gunzipBytes(t, f.Path, b)
			}
		}
		if !slices.Contains(paths, f.Path) {
			paths = append(paths, f.Path)
		}
		want[f.Path] = append(want[f.Path], b...)
	}
	if attested {
		paths = append(paths, BootstrapperEnvPath)
	} else {
		paths = append(paths, InstallScriptPath, IgnitionKubeadmConfigPath)
		want[IgnitionKubeadmConfigPath] = in.KubeadmConfig
	}
	var chrony strings.Builder
	if ptr.Deref(spec.NTP.Enabled, true) {
		for _, s := range spec.NTP.Servers {
			fmt.Fprintf(&chrony, "server %s iburst\n", s)
		}
	}
	if chrony.Len() > 0 {
		paths = append(paths, ChronyConfPath)
		want[ChronyConfPath] = []byte(chrony.String())
	}
	var userCmds [][]string
	var sudoers strings.Builder
	for _, u := range spec.Users {
		cmd := []string{"usermod"}
		if ptr.Deref(u.LockPassword, false) {
			cmd = append(cmd, "--lock")
		}
		if ptr.Deref(u.Inactive, false) {
			cmd = append(cmd, "--inactive", "0")
		}
		if len(cmd) > 1 {
			userCmds = append(userCmds, append(cmd, u.Name))
		}
		if u.Sudo != "" {
			fmt.Fprintf(&sudoers, "%s %s\n", u.Name, u.Sudo)
		}
	}
	var boot [][]string
	for _, c := range spec.BootCommands {
		boot = append(boot, []string{"/bin/sh", "-c", c})
	}
	commands := append(append(userCmds, boot...), expectedCommands(in)...)
	onlyBootstrapper := attested && len(commands) == 1
	if !onlyBootstrapper {
		paths = append(paths, ignition.ScriptPath)
	}
	if sudoers.Len() > 0 {
		paths = append(paths, SudoersPath)
		want[SudoersPath] = []byte(sudoers.String())
	}
	var gotPaths []string
	for _, f := range cfg.Storage.Files {
		gotPaths = append(gotPaths, f.Path)
	}
	if !slices.Equal(gotPaths, paths) {
		t.Fatalf("Ignition writes the files %q, want exactly %q", gotPaths, paths)
	}
	for p, b := range want {
		if !bytes.Equal(files[p], b) {
			t.Fatalf("%s holds %q, want %q", p, files[p], b)
		}
	}
	// Each NTP server and sudo rule is one line of its file, which it
	// cannot end or continue.
	if lines := fileLines(files[ChronyConfPath]); len(lines) != strings.Count(chrony.String(), "\n") {
		t.Fatalf("%s has %d lines for %d servers: %q", ChronyConfPath, len(lines), strings.Count(chrony.String(), "\n"), files[ChronyConfPath])
	} else {
		for _, l := range lines {
			if !chronyServer.MatchString(l) {
				t.Fatalf("%s has the line %q", ChronyConfPath, l)
			}
		}
	}
	if lines := fileLines(files[SudoersPath]); len(lines) != strings.Count(sudoers.String(), "\n") {
		t.Fatalf("%s has %d lines for %d rules: %q", SudoersPath, len(lines), strings.Count(sudoers.String(), "\n"), files[SudoersPath])
	} else {
		for _, l := range lines {
			if !sudoRule.MatchString(l) {
				t.Fatalf("%s has the line %q", SudoersPath, l)
			}
		}
	}
	for _, f := range cfg.Storage.Files {
		for _, src := range in.Files {
			if src.Path == f.Path && src.Permissions != "" && !src.Append {
				if m, err := strconv.ParseUint(src.Permissions, 8, 12); err != nil || ptr.Deref(f.Mode, -1) != int(m) {
					t.Fatalf("%s has mode %v, want %s", f.Path, f.Mode, src.Permissions)
				}
			}
		}
	}

	// The commands, read back from the script's quoting.
	if onlyBootstrapper {
		if len(cfg.Systemd.Units) == 0 || cfg.Systemd.Units[0].Name != BootstrapperUnit || !ptr.Deref(cfg.Systemd.Units[0].Enabled, false) {
			t.Fatalf("attested data with no commands does not enable %s: %+v", BootstrapperUnit, cfg.Systemd.Units)
		}
	} else {
		got := scriptCommands(t, string(files[ignition.ScriptPath]))
		if !reflect.DeepEqual(got, commands) {
			t.Fatalf("the commands script runs\n%q\nwant\n%q", got, commands)
		}
	}

	// Users.
	if len(cfg.Passwd.Users) != len(spec.Users) {
		t.Fatalf("%d Ignition users for %d in the spec", len(cfg.Passwd.Users), len(spec.Users))
	}
	for i, u := range spec.Users {
		var groups []types.Group
		for g := range strings.SplitSeq(u.Groups, ",") {
			if g = strings.TrimSpace(g); g != "" {
				groups = append(groups, types.Group(g))
			}
		}
		var keys []types.SSHAuthorizedKey
		for _, k := range u.SSHAuthorizedKeys {
			keys = append(keys, types.SSHAuthorizedKey(k))
		}
		want := types.PasswdUser{Name: u.Name, Gecos: optional(u.Gecos), Groups: groups, HomeDir: optional(u.HomeDir), Shell: optional(u.Shell),
			PasswordHash: optional(u.Passwd), PrimaryGroup: optional(u.PrimaryGroup), SSHAuthorizedKeys: keys}
		if !reflect.DeepEqual(cfg.Passwd.Users[i], want) {
			t.Fatalf("Ignition user %d is %+v, want %+v", i, cfg.Passwd.Users[i], want)
		}
	}

	// Units: the commands' (or the bootstrapper's), then one per mount,
	// each setting exactly the entry's value.
	wantUnits := len(spec.Mounts) + 1
	if len(cfg.Systemd.Units) != wantUnits {
		t.Fatalf("%d units for %d mounts", len(cfg.Systemd.Units), len(spec.Mounts))
	}
	for i, m := range spec.Mounts {
		checkMountUnit(t, cfg.Systemd.Units[i+1], m)
	}
	if len(cfg.Storage.Filesystems) != len(spec.DiskSetup.Filesystems) {
		t.Fatalf("%d Ignition file systems for %d in the spec", len(cfg.Storage.Filesystems), len(spec.DiskSetup.Filesystems))
	}
	for i, fs := range spec.DiskSetup.Filesystems {
		got := cfg.Storage.Filesystems[i]
		var opts []types.FilesystemOption
		for _, o := range fs.ExtraOpts {
			opts = append(opts, types.FilesystemOption(o))
		}
		if ptr.Deref(got.Format, "") != fs.Filesystem || !reflect.DeepEqual(got.Options, opts) {
			t.Fatalf("Ignition file system %d is %+v, want %+v", i, got, fs)
		}
	}
}

// chronyServer and sudoRule are the only lines of their files: one
// directive each, which no character ends, continues or comments out.
var (
	chronyServer = regexp.MustCompile(`^server [^\s#\\]+ iburst$`)
	sudoRule     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*\$? [^\x00-\x1f\x7f]*[^\x00-\x1f\x7f\\]$`)
)

// fileLines are the lines of a text file that ends each line.
func fileLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// unitLine is one line of a unit the renderer writes.
var unitLine = regexp.MustCompile(`^(\[(Mount|Swap|Install)\]|(What|Where|Type|Options|WantedBy|RequiredBy)=(.*)|)$`)

// checkMountUnit: the unit has only the lines a mount or swap unit
// needs, each setting once, and Where and Options are the entry's own.
func checkMountUnit(t *testing.T, u types.Unit, m cabpkv1.MountPoints) {
	t.Helper()
	settings := map[string]string{}
	for line := range strings.SplitSeq(ptr.Deref(u.Contents, ""), "\n") {
		g := unitLine.FindStringSubmatch(line)
		if g == nil {
			t.Fatalf("unit %s has the line %q:\n%s", u.Name, line, ptr.Deref(u.Contents, ""))
		}
		if g[3] == "" {
			continue
		}
		if _, dup := settings[g[3]]; dup {
			t.Fatalf("unit %s sets %s twice", u.Name, g[3])
		}
		settings[g[3]] = strings.ReplaceAll(g[4], "%%", "%")
	}
	if opts := field(m, 3); settings["Options"] != opts {
		t.Fatalf("unit %s: Options=%q, want %q", u.Name, settings["Options"], opts)
	}
	if where, ok := settings["Where"]; ok && where != m[1] {
		t.Fatalf("unit %s: Where=%q, want %q", u.Name, where, m[1])
	}
}

// scriptCommands reads back the commands of the Ignition commands script:
// after its two first lines, single-quoted words (a quote written '"'"'),
// separated by a space, each command ending with a line break outside the
// quotes.
func scriptCommands(t *testing.T, script string) [][]string {
	t.Helper()
	rest, ok := strings.CutPrefix(script, "#!/bin/sh\nset -eu\n")
	if !ok {
		t.Fatalf("the commands script starts %q", script[:min(len(script), 40)])
	}
	var cmds [][]string
	var argv []string
	for rest != "" {
		if !strings.HasPrefix(rest, "'") {
			t.Fatalf("the commands script has %q where a quoted word starts", rest[:min(len(rest), 40)])
		}
		var word strings.Builder
		rest = rest[1:]
		for {
			n := strings.IndexByte(rest, '\'')
			if n < 0 {
				t.Fatal("the commands script ends in a quoted word")
			}
			word.WriteString(rest[:n])
			rest = rest[n+1:]
			if !strings.HasPrefix(rest, `"'"'`) {
				break
			}
			word.WriteByte('\'')
			rest = rest[4:]
		}
		argv = append(argv, word.String())
		switch {
		case strings.HasPrefix(rest, " "):
			rest = rest[1:]
		case strings.HasPrefix(rest, "\n"):
			cmds, argv, rest = append(cmds, argv), nil, rest[1:]
		default:
			t.Fatalf("the commands script has %q after a quoted word", rest[:min(len(rest), 40)])
		}
	}
	if argv != nil {
		t.Fatal("the commands script's last command has no line break")
	}
	return cmds
}

func gunzipBytes(t *testing.T, path string, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("file %s rendered though its content is not gzip: %v", path, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("file %s rendered though its content is not gzip: %v", path, err)
	}
	return out
}

// envAssignment is what systemd's EnvironmentFile reads as one assignment
// whose value no quote, backslash or dollar can end or expand.
var envAssignment = regexp.MustCompile(`^GATEHOUSE_BOOTSTRAPPER_ARGS="([^"\\$\n]*)"\n$`)

// checkAttested: the environment file is one plain assignment of exactly
// the expected arguments.
func checkAttested(t *testing.T, in Input, format bootstrapv1.Format, data []byte) {
	t.Helper()
	var env string
	if format == bootstrapv1.FormatIgnition {
		env = string(rendertest.Files(t, format, data)[BootstrapperEnvPath])
	} else {
		var cfg struct {
			WriteFiles []struct{ Path, Content string } `json:"write_files"`
		}
		if err := yaml.Unmarshal(cloudInitRendered(t, data), &cfg); err != nil {
			t.Fatal(err)
		}
		for _, f := range cfg.WriteFiles {
			if f.Path == BootstrapperEnvPath {
				env = f.Content
			}
		}
	}
	m := envAssignment.FindStringSubmatch(env)
	if m == nil {
		t.Fatalf("%s is not one plain assignment: %q", BootstrapperEnvPath, env)
	}
	want := []string{"--success-file", SentinelPath}
	if in.Role == RoleJoin {
		want = append(want, "--join-endpoints", strings.Join(in.Spec.Attested.JoinEndpoints, ","), "--cluster-ca-hash", in.ClusterCAHash)
		if in.ControlPlane {
			want = append(want, "--control-plane")
		}
		// The join's node registration, exactly as the spec has it.
		reg := in.Spec.JoinConfiguration.NodeRegistration
		if reg.Taints != nil {
			want = append(want, "--node-taints", kubeadm.FormatTaints(*reg.Taints))
		}
		for _, a := range reg.KubeletExtraArgs {
			want = append(want, "--kubelet-arg", a.Name+"="+ptr.Deref(a.Value, ""))
		}
	}
	if got := strings.Fields(m[1]); !slices.Equal(got, want) {
		t.Fatalf("bootstrapper arguments %q, want %q", got, want)
	}
}

// cloudInitRendered is the document cloud-init reads of cloud-config data
// (after Jinja), from the long-running cloud-init.
func cloudInitRendered(t *testing.T, data []byte) []byte {
	t.Helper()
	res, err := cloudInitChecker(t).Check(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Config == nil {
		t.Fatalf("cloud-init refuses the data: %s", res.Error)
	}
	b, err := json.Marshal(res.Config)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
