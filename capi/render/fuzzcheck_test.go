package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

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
		paths = append(paths, IgnitionBootstrapperEnvPath)
	} else {
		paths = append(paths, installScriptPath, IgnitionKubeadmConfigPath)
		want[IgnitionKubeadmConfigPath] = in.KubeadmConfig
	}
	var chrony strings.Builder
	if ptr.Deref(spec.NTP.Enabled, true) {
		for _, s := range spec.NTP.Servers {
			fmt.Fprintf(&chrony, "server %s iburst\n", s)
		}
	}
	if chrony.Len() > 0 {
		paths = append(paths, chronyConfPath)
		want[chronyConfPath] = []byte(chrony.String())
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
		paths = append(paths, commandsScriptPath)
	}
	if sudoers.Len() > 0 {
		paths = append(paths, sudoersPath)
		want[sudoersPath] = []byte(sudoers.String())
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
	if lines := fileLines(files[chronyConfPath]); len(lines) != strings.Count(chrony.String(), "\n") {
		t.Fatalf("%s has %d lines for %d servers: %q", chronyConfPath, len(lines), strings.Count(chrony.String(), "\n"), files[chronyConfPath])
	} else {
		for _, l := range lines {
			if !chronyServer.MatchString(l) {
				t.Fatalf("%s has the line %q", chronyConfPath, l)
			}
		}
	}
	if lines := fileLines(files[sudoersPath]); len(lines) != strings.Count(sudoers.String(), "\n") {
		t.Fatalf("%s has %d lines for %d rules: %q", sudoersPath, len(lines), strings.Count(sudoers.String(), "\n"), files[sudoersPath])
	} else {
		for _, l := range lines {
			if !sudoRule.MatchString(l) {
				t.Fatalf("%s has the line %q", sudoersPath, l)
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
		if len(cfg.Systemd.Units) == 0 || cfg.Systemd.Units[0].Name != bootstrapperUnit || !ptr.Deref(cfg.Systemd.Units[0].Enabled, false) {
			t.Fatalf("attested data with no commands does not enable %s: %+v", bootstrapperUnit, cfg.Systemd.Units)
		}
	} else {
		got := scriptCommands(t, string(files[commandsScriptPath]))
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
		env = string(rendertest.Files(t, format, data)[IgnitionBootstrapperEnvPath])
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
		t.Fatalf("%s is not one plain assignment: %q", BootstrapperEnvPathFor(format), env)
	}
	want := []string{"--success-file", sentinelPath}
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
