package render

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/cloudinit"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
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
	if !bytes.HasPrefix(data, []byte(jinjaHeader+"#cloud-config\n")) {
		t.Fatalf("the data does not start with %q:\n%s", jinjaHeader+"#cloud-config", data)
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
		cmds = append(cmds, []string{installScriptPath})
	}
	for _, c := range spec.PreKubeadmCommands {
		cmds = append(cmds, []string{"/bin/sh", "-c", c})
	}
	if attested {
		cmds = append(cmds, []string{"systemctl", "enable", "--now", bootstrapperUnit})
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
		cmds = append(cmds, []string{"/bin/sh", "-c", "mkdir -p /run/cluster-api && echo success > " + sentinelPath})
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
		files = append(files, map[string]any{"path": installScriptPath, "content": installScript(components), "permissions": "0700"})
		files = append(files, map[string]any{"path": KubeadmConfigPath, "content": string(in.KubeadmConfig), "owner": "root:root", "permissions": "0640"})
	} else {
		env, _ := bootstrapperEnv(in)
		files = append(files, map[string]any{"path": BootstrapperEnvPathFor(bootstrapv1.FormatCloudConfig), "content": env, "permissions": "0644"})
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
