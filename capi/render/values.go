package render

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/cloudinit"
)

// Every value of the spec is checked here, once, for the program that
// finally reads it on the machine, with the same rule in both formats: a
// value is refused where that program would split it into more than the
// spec says (a second fstab entry, sudoers rule, authorized key or passwd
// field, another unit setting). The error names the spec's field; the
// controller reports it as RenderFailed. docs/capi.md, "Who may write a
// KubeadmConfig", lists the rules.

// errValue is wrapped by the errors of checkValues and checkTemplates.
var errValue = errors.New("invalid value")

// breaksLine says r ends or splits a line for some reader: the C0 and C1
// control characters (tab, newline, carriage return, NEL U+0085 among
// them), DEL, and the Unicode line and paragraph separators.
func breaksLine(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || r == '\u2028' || r == '\u2029'
}

// valueError names a field and what is wrong with it; show says whether
// the value may be quoted (never a password hash).
func valueError(field, value string, show bool, format string, args ...any) error {
	what := field
	if show {
		what = fmt.Sprintf("%s %.80q", field, value)
	}
	return fmt.Errorf("%w: %s: %s", errValue, what, fmt.Sprintf(format, args...))
}

// oneLine refuses a value holding a character that breaks a line.
func oneLine(field, value string, show bool, reader string) error {
	if strings.ContainsFunc(value, breaksLine) {
		return valueError(field, value, show, "%s reads it as more than one line: it must hold no control character or line separator", reader)
	}
	return nil
}

// checkValues checks each value of the spec and the files for its reader
// on the machine (both formats).
func checkValues(in Input) error {
	spec := in.Spec
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for i, u := range spec.Users {
		at := fmt.Sprintf("spec.users[%d]", i)
		if !userName.MatchString(u.Name) {
			add(valueError(at+".name", u.Name, true, "a user name is letters, digits, '_', '.' and '-', starting with a letter or '_' (useradd's portable names)"))
		}
		if u.PrimaryGroup != "" && !userName.MatchString(u.PrimaryGroup) {
			add(valueError(at+".primaryGroup", u.PrimaryGroup, true, "a group name is letters, digits, '_', '.' and '-', starting with a letter or '_'"))
		}
		for g := range strings.SplitSeq(u.Groups, ",") {
			if g = strings.TrimSpace(g); g != "" && !userName.MatchString(g) {
				add(valueError(at+".groups", u.Groups, true, "groups are group names (letters, digits, '_', '.' and '-') separated by commas"))
				break
			}
		}
		// Fields of /etc/passwd and /etc/shadow, which ':' separates.
		for _, f := range []struct {
			name, value string
			show        bool
		}{{"gecos", u.Gecos, true}, {"homeDir", u.HomeDir, true}, {"shell", u.Shell, true}, {"passwd", u.Passwd, false}} {
			if err := oneLine(at+"."+f.name, f.value, f.show, "/etc/passwd"); err != nil {
				add(err)
			} else if strings.Contains(f.value, ":") {
				add(valueError(at+"."+f.name, f.value, f.show, "':' separates the fields of /etc/passwd and /etc/shadow"))
			}
		}
		for j, k := range u.SSHAuthorizedKeys {
			add(oneLine(fmt.Sprintf("%s.sshAuthorizedKeys[%d]", at, j), k, true, "authorized_keys"))
		}
		// Both formats write the rule as a line of a sudoers file, which a
		// line break would end and a trailing backslash continue.
		if strings.ContainsFunc(u.Sudo, breaksLine) || strings.HasSuffix(u.Sudo, `\`) {
			add(valueError(at+".sudo", u.Sudo, true, "a sudo rule is one line of sudoers, without a control character, a line separator or a trailing backslash"))
		}
	}
	for i, srv := range spec.NTP.Servers {
		// Each server becomes a line "server <name> iburst" of the time
		// daemon's configuration.
		if !ntpServer.MatchString(srv) {
			add(valueError(fmt.Sprintf("spec.ntp.servers[%d]", i), srv, true, "a server is a host name or an IP address"))
		}
	}
	for i, p := range spec.DiskSetup.Partitions {
		add(oneLine(fmt.Sprintf("spec.diskSetup.partitions[%d].device", i), p.Device, true, "the partitioning command"))
	}
	for i, fs := range spec.DiskSetup.Filesystems {
		at := fmt.Sprintf("spec.diskSetup.filesystems[%d]", i)
		for _, f := range []struct{ name, value string }{{"device", fs.Device}, {"filesystem", fs.Filesystem}, {"label", fs.Label},
			{"partition", fs.Partition}, {"replaceFS", fs.ReplaceFS}} {
			add(oneLine(at+"."+f.name, f.value, true, "mkfs"))
		}
		for j, o := range fs.ExtraOpts {
			add(oneLine(fmt.Sprintf("%s.extraOpts[%d]", at, j), o, true, "mkfs"))
		}
	}
	for i, m := range spec.Mounts {
		for j, f := range m {
			// cloud-init writes the entry as a line of /etc/fstab, fields
			// separated by tabs; fstab splits at any white space. Ignition's
			// mount unit takes the same fields.
			at := fmt.Sprintf("spec.mounts[%d][%d]", i, j)
			if err := oneLine(at, f, true, "/etc/fstab"); err != nil {
				add(err)
			} else if strings.ContainsFunc(f, unicode.IsSpace) {
				add(valueError(at, f, true, "/etc/fstab splits its fields at white space"))
			}
		}
	}
	for i, f := range in.Files {
		at := fileField(spec, i, f)
		add(oneLine(at+".path", f.Path, true, "the file system"))
		if f.Owner != "" {
			user, group, _ := strings.Cut(f.Owner, ":")
			if !userName.MatchString(user) || group != "" && !userName.MatchString(group) {
				add(valueError(at+".owner", f.Owner, true, "an owner is user or user:group, each a name of letters, digits, '_', '.' and '-'"))
			}
		}
	}
	for _, c := range commandFields(spec) {
		// The commands run from a shell script, which cannot hold NUL.
		if strings.ContainsRune(c.value, 0) {
			add(valueError(c.field, c.value, true, "a shell script cannot hold NUL"))
		}
	}
	return errors.Join(errs...)
}

// fileField names the i-th file of the render input: the spec's, or one
// the controller added (the CA files).
func fileField(spec *bootstrapv1.KubeadmConfigSpec, i int, f File) string {
	if i < len(spec.Files) && spec.Files[i].Path == f.Path {
		return fmt.Sprintf("spec.files[%d]", i)
	}
	return fmt.Sprintf("file %s", f.Path)
}

type namedValue struct{ field, value string }

// commandFields are the spec's commands, named.
func commandFields(spec *bootstrapv1.KubeadmConfigSpec) []namedValue {
	var out []namedValue
	for _, list := range []struct {
		name string
		cmds []string
	}{{"bootCommands", spec.BootCommands}, {"preKubeadmCommands", spec.PreKubeadmCommands}, {"postKubeadmCommands", spec.PostKubeadmCommands}} {
		for i, c := range list.cmds {
			out = append(out, namedValue{fmt.Sprintf("spec.%s[%d]", list.name, i), c})
		}
	}
	return out
}

// checkTemplates checks, for cloud-config, the values cloud-init's Jinja
// renders (commands, files' contents, the kubeadm configuration): each
// may hold references to instance data and {% raw %}…{% endraw %} only
// (cloudinit.ParseTemplate).
func checkTemplates(in Input) error {
	var errs []error
	check := func(field, value string) {
		if _, err := cloudinit.ParseTemplate(value); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: the cloud-config is a Jinja template (%s) whose values may hold only references to instance data "+
				"({{ ds.meta_data.local_hostname }}) and literal text in {%% raw %%}…{%% endraw %%}: %w", errValue, field, strings.TrimSpace(jinjaHeader), err))
		}
	}
	for _, c := range commandFields(in.Spec) {
		check(c.field, c.value)
	}
	for i, f := range in.Files {
		if f.Encoding == EncodingNone {
			check(fileField(in.Spec, i, f)+".content", f.Content)
		}
	}
	check("the kubeadm configuration (spec.clusterConfiguration, initConfiguration, joinConfiguration)", string(in.KubeadmConfig))
	return errors.Join(errs...)
}
