package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	ignv3 "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
)

// sudoersPath holds the users' sudo rules in Ignition data (cloud-init
// writes its own, /etc/sudoers.d/90-cloud-init-users). sudo skips files
// in sudoers.d whose names contain a dot.
const sudoersPath = "/etc/sudoers.d/90-gatehouse-users"

// chronyConfPath holds the NTP servers in Ignition data.
const chronyConfPath = "/etc/chrony.d/gatehouse.conf"

// Ignition itself runs nothing: the commands go into a script a oneshot
// unit runs.
const (
	// commandsScriptPath holds the commands, run in order by
	// commandsUnitName.
	commandsScriptPath = "/etc/gatehouse/bootstrap-commands.sh"
	// commandsUnitName runs commandsScriptPath once, after the network is
	// up; its text is commandsUnit.
	commandsUnitName = "gatehouse-bootstrap-commands.service"
)

// renderIgnition maps the plan to an Ignition config (spec
// ignitionVersion) of coreos/ignition's types: files, users, disks, file
// systems, mount units, and the commands in a script run by a oneshot
// unit, as Ignition itself runs nothing. The Butane additions, translated
// by translateButane (butane.go), are merged over the result last, so they
// win.
func renderIgnition(s *steps) ([]byte, error) {
	files := s.files
	if len(s.ntp.Servers) > 0 && ptr.Deref(s.ntp.Enabled, true) {
		// enabled: false configures nothing, as cloud-init's ntp module.
		var conf strings.Builder
		for _, srv := range s.ntp.Servers {
			fmt.Fprintf(&conf, "server %s iburst\n", srv)
		}
		files = append(files[:len(files):len(files)], File{Path: chronyConfPath, Content: conf.String(), Permissions: "0644"})
	}
	users, err := ignitionUserCommands(s.users)
	if err != nil {
		return nil, err
	}
	// Ignition runs nothing early; account changes and boot commands run
	// first in the unit.
	commands := append(append(users, s.bootCommands...), s.commands...)
	cfg := types.Config{Ignition: types.Ignition{Version: ignitionVersion}}
	if s.onlyStartsBootstrapper && len(commands) == 1 {
		cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{Name: bootstrapperUnit, Enabled: ptr.To(true)})
	} else if len(commands) > 0 {
		files = append(files[:len(files):len(files)], File{Path: commandsScriptPath, Content: "#!/bin/sh\nset -eu\n" + shellScript(commands), Permissions: "0700"})
		cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{Name: commandsUnitName, Enabled: ptr.To(true), Contents: ptr.To(commandsUnit)})
	}
	if err := addFiles(&cfg, files); err != nil {
		return nil, err
	}
	if err := addUsers(&cfg, s.users); err != nil {
		return nil, err
	}
	if err := addIgnitionStorage(&cfg, s.disks, s.mounts); err != nil {
		return nil, err
	}
	if strings.TrimSpace(s.butane) != "" {
		additions, err := translateButane(s.butane)
		if err != nil {
			return nil, err
		}
		cfg = ignv3.Merge(cfg, additions)
	}
	if err := checkUTF8(reflect.ValueOf(cfg)); err != nil {
		return nil, err
	}
	return finishIgnition(cfg)
}

// checkUTF8 refuses a string that is not UTF-8, which JSON would silently
// replace (a user's name, a path, a unit).
func checkUTF8(v reflect.Value) error {
	switch v.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return fmt.Errorf("%q is not UTF-8 text, which Ignition's JSON is", v.String())
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return checkUTF8(v.Elem())
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := checkUTF8(v.Index(i)); err != nil {
				return err
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if err := checkUTF8(v.Field(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// commandsUnit runs the commands script once, after the network is up,
// until the bootstrap succeeded (CABPK's sentinel).
const commandsUnit = "[Unit]\nDescription=Gatehouse bootstrap commands\nWants=network-online.target\nAfter=network-online.target\n" +
	"ConditionPathExists=!" + sentinelPath + "\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=" + commandsScriptPath +
	"\n\n[Install]\nWantedBy=multi-user.target\n"

// shellScript quotes each argv for sh, one command a line.
func shellScript(cmds [][]string) string {
	var b strings.Builder
	for _, argv := range cmds {
		for i, a := range argv {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString("'" + strings.ReplaceAll(a, "'", `'"'"'`) + "'")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// finishIgnition encodes cfg without its empty objects and lists, and
// checks it with coreos/ignition's validator.
func finishIgnition(cfg types.Config) ([]byte, error) {
	full, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	out, err := compactJSON(full)
	if err != nil {
		return nil, err
	}
	if _, report, err := ignv3.Parse(out); err != nil {
		return nil, fmt.Errorf("the rendered Ignition config is invalid: %w: %s", err, report.String())
	} else if report.IsFatal() {
		return nil, fmt.Errorf("the rendered Ignition config is invalid: %s", report.String())
	}
	return out, nil
}

// addFiles writes the files; appends go to the file's append list, after
// what an earlier file of the same path writes.
func addFiles(cfg *types.Config, files []File) error {
	byPath := map[string]int{}
	var z compressor
	for _, f := range files {
		res, err := z.resource(f)
		if err != nil {
			return err
		}
		if i, ok := byPath[f.Path]; ok && f.Append {
			cfg.Storage.Files[i].Append = append(cfg.Storage.Files[i].Append, res)
			continue
		}
		if _, ok := byPath[f.Path]; ok {
			return fmt.Errorf("file %s is written twice", f.Path)
		}
		out := types.File{Node: types.Node{Path: f.Path}}
		if f.Append {
			out.Append = []types.Resource{res}
		} else {
			out.Overwrite, out.Contents = ptr.To(true), res
		}
		if f.Permissions != "" || !f.Append {
			// An append without permissions keeps the file's mode.
			mode, err := fileMode(f)
			if err != nil {
				return err
			}
			out.Mode = &mode
		}
		if user, group, ok := strings.Cut(f.Owner, ":"); f.Owner != "" {
			out.User.Name = optional(user)
			if ok {
				out.Group.Name = optional(group)
			}
		}
		byPath[f.Path] = len(cfg.Storage.Files)
		cfg.Storage.Files = append(cfg.Storage.Files, out)
	}
	return nil
}

// compressor gzips file contents for one render: a gzip writer costs
// most of a megabyte of tables, so one serves all files.
type compressor struct {
	zw  *gzip.Writer
	out bytes.Buffer
}

// resource is f's content as an Ignition data URL, gzip-compressed when f
// is, or when that makes the data URL shorter (Ignition decompresses it;
// user data is small on most clouds).
func (z *compressor) resource(f File) (types.Resource, error) {
	content := []byte(f.Content)
	if f.Encoding != EncodingNone {
		var err error
		if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
			return types.Resource{}, fmt.Errorf("file %s: content is not base64: %w", f.Path, err)
		}
	}
	if f.Encoding == EncodingGzipBase64 {
		return dataResource(content, true), nil
	}
	if len(content) >= minGzip {
		if packed, err := z.gzip(content); err == nil && len(packed) < len(content) {
			return dataResource(packed, true), nil
		}
	}
	return dataResource(content, false), nil
}

// minGzip is the content size from which gzip may pay for its header.
const minGzip = 128

func dataResource(b []byte, gzipped bool) types.Resource {
	res := types.Resource{Source: ptr.To("data:;base64," + base64.StdEncoding.EncodeToString(b))}
	if gzipped {
		res.Compression = ptr.To("gzip")
	}
	return res
}

// gzip compresses b; the same input gives the same output (no time in the
// header). The result is valid until the next call.
func (z *compressor) gzip(b []byte) ([]byte, error) {
	z.out.Reset()
	if z.zw == nil {
		z.zw = gzip.NewWriter(&z.out)
	} else {
		z.zw.Reset(&z.out)
	}
	if _, err := z.zw.Write(b); err != nil {
		return nil, err
	}
	if err := z.zw.Close(); err != nil {
		return nil, err
	}
	return z.out.Bytes(), nil
}

// fileMode is f's octal permissions, 0644 when unset (cloud-init's
// default).
func fileMode(f File) (int, error) {
	if f.Permissions == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(f.Permissions, 8, 12)
	if err != nil {
		return 0, fmt.Errorf("file %s: permissions %q: %w", f.Path, f.Permissions, err)
	}
	return int(m), nil
}

// userName is what the account commands and the sudoers file may name:
// useradd's portable names (no shell or sudoers metacharacters).
var userName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*\$?$`)

// addUsers writes the users as Ignition users, with what cloud-init's
// users module does beyond creating them: sudo rules in sudoersPath.
func addUsers(cfg *types.Config, users []cabpkv1.User) error {
	var sudoers strings.Builder
	for _, u := range users {
		pu := types.PasswdUser{Name: u.Name}
		for g := range strings.SplitSeq(u.Groups, ",") {
			if g = strings.TrimSpace(g); g != "" {
				pu.Groups = append(pu.Groups, types.Group(g))
			}
		}
		pu.Gecos, pu.HomeDir, pu.Shell = optional(u.Gecos), optional(u.HomeDir), optional(u.Shell)
		pu.PasswordHash, pu.PrimaryGroup = optional(u.Passwd), optional(u.PrimaryGroup)
		for _, k := range u.SSHAuthorizedKeys {
			pu.SSHAuthorizedKeys = append(pu.SSHAuthorizedKeys, types.SSHAuthorizedKey(k))
		}
		cfg.Passwd.Users = append(cfg.Passwd.Users, pu)
		if u.Sudo != "" {
			if !userName.MatchString(u.Name) || strings.ContainsFunc(u.Sudo, isControl) {
				return fmt.Errorf("user %q: a sudo rule needs a plain user name and a one-line rule", u.Name)
			}
			fmt.Fprintf(&sudoers, "%s %s\n", u.Name, u.Sudo)
		}
	}
	if sudoers.Len() > 0 {
		return addFiles(cfg, []File{{Path: sudoersPath, Content: sudoers.String(), Permissions: "0440"}})
	}
	return nil
}

// ignitionUserCommands do what Ignition's users have no field for:
// lockPassword (cloud-init's lock_passwd, `passwd -l`) and inactive.
// Ignition locks no password by itself, so an unset lockPassword leaves
// the password usable, as in CABPK's Ignition.
func ignitionUserCommands(users []cabpkv1.User) ([][]string, error) {
	var cmds [][]string
	for _, u := range users {
		cmd := []string{"usermod"}
		if ptr.Deref(u.LockPassword, false) {
			cmd = append(cmd, "--lock")
		}
		if ptr.Deref(u.Inactive, false) {
			cmd = append(cmd, "--inactive", "0")
		}
		if len(cmd) == 1 {
			continue
		}
		if !userName.MatchString(u.Name) {
			return nil, fmt.Errorf("user %q: lockPassword and inactive need a plain user name", u.Name)
		}
		cmds = append(cmds, append(cmd, u.Name))
	}
	return cmds, nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// compactJSON drops the empty objects and lists (and nulls) of a JSON
// document: Ignition's types encode every unset section as {}, which means
// the same as no section at all and makes up a third of small configs.
func compactJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	v, _ = prune(v)
	return json.Marshal(v)
}

// prune returns v without empty members; keep is false when v itself is
// empty.
func prune(v any) (out any, keep bool) {
	switch t := v.(type) {
	case map[string]any:
		for k, member := range t {
			if p, ok := prune(member); ok {
				t[k] = p
			} else {
				delete(t, k)
			}
		}
		return t, len(t) > 0
	case []any:
		kept := t[:0]
		for _, item := range t {
			if p, ok := prune(item); ok {
				kept = append(kept, p)
			}
		}
		return kept, len(kept) > 0
	case nil:
		return nil, false
	}
	return v, true
}
