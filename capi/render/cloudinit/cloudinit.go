// Package cloudinit renders cloud-config user data (cloud-init's
// "#cloud-config" YAML, https://cloudinit.readthedocs.io/en/latest/reference/modules.html)
// from typed structures, never from string templates, so every value is
// written in a YAML style that holds it as it is (yaml.go). Tests check the
// output with cloud-init's own `cloud-init schema`.
package cloudinit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// header is the first line cloud-init requires of cloud-config user data.
const header = "#cloud-config\n"

// Config is the subset of cloud-config a kubeadm bootstrap uses.
type Config struct {
	// BootCmd runs early on every boot (cc_bootcmd).
	BootCmd []Command `json:"bootcmd,omitempty"`
	// WriteFiles are written before RunCmd (cc_write_files).
	WriteFiles []File `json:"write_files,omitempty"`
	// Users are created (cc_users_groups); the default user is kept unless
	// Users is set.
	Users []User `json:"users,omitempty"`
	// NTP configures time synchronisation (cc_ntp).
	NTP *NTP `json:"ntp,omitempty"`
	// DiskSetup partitions disks by device (cc_disk_setup).
	DiskSetup map[string]DiskSetup `json:"disk_setup,omitempty"`
	// FSSetup creates file systems (cc_disk_setup).
	FSSetup []FSSetup `json:"fs_setup,omitempty"`
	// Mounts are fstab entries: device, mount point, type, options, dump,
	// pass (cc_mounts).
	Mounts [][]string `json:"mounts,omitempty"`
	// RunCmd runs once, last (cc_runcmd).
	RunCmd []Command `json:"runcmd,omitempty"`
}

// Command is one command as an argv, run without a shell.
type Command []string

// File is one file to write.
type File struct {
	Path string `json:"path"`
	// Content is the file's content; with Encoding "b64" base64 of it.
	Content     string `json:"content"`
	Encoding    string `json:"encoding,omitempty"`
	Owner       string `json:"owner,omitempty"`
	Permissions string `json:"permissions,omitempty"`
	Append      bool   `json:"append,omitempty"`
}

// User is a user account.
type User struct {
	Name              string   `json:"name"`
	Gecos             string   `json:"gecos,omitempty"`
	Groups            string   `json:"groups,omitempty"`
	HomeDir           string   `json:"homedir,omitempty"`
	Inactive          string   `json:"inactive,omitempty"`
	Shell             string   `json:"shell,omitempty"`
	Passwd            string   `json:"passwd,omitempty"`
	PrimaryGroup      string   `json:"primary_group,omitempty"`
	LockPasswd        *bool    `json:"lock_passwd,omitempty"`
	Sudo              string   `json:"sudo,omitempty"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
}

// NTP configures time servers.
type NTP struct {
	Enabled *bool    `json:"enabled,omitempty"`
	Servers []string `json:"servers,omitempty"`
	Pools   []string `json:"pools,omitempty"`
}

// DiskSetup partitions one disk.
type DiskSetup struct {
	TableType string `json:"table_type,omitempty"`
	// Layout is true (one partition) or a list of partition sizes in
	// percent; it is rendered as given.
	Layout    any   `json:"layout,omitempty"`
	Overwrite *bool `json:"overwrite,omitempty"`
}

// FSSetup creates one file system.
type FSSetup struct {
	Label      string `json:"label,omitempty"`
	Filesystem string `json:"filesystem"`
	Device     string `json:"device"`
	// Partition is auto, any, none, or a partition number (an int).
	Partition any      `json:"partition,omitempty"`
	Overwrite *bool    `json:"overwrite,omitempty"`
	ReplaceFS string   `json:"replace_fs,omitempty"`
	ExtraOpts []string `json:"extra_opts,omitempty"`
}

// validate checks what cloud-init would only find at boot: absolute, clean
// file paths without duplicates, octal permissions, known encodings, named
// users.
func (c *Config) validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, f := range c.WriteFiles {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			errs = append(errs, fmt.Errorf("write_files[%d]: path %q must be absolute and clean", i, f.Path))
		}
		if seen[f.Path] && !f.Append {
			errs = append(errs, fmt.Errorf("write_files[%d]: %s is written twice", i, f.Path))
		}
		seen[f.Path] = true
		if f.Permissions != "" && !octalMode(f.Permissions) {
			errs = append(errs, fmt.Errorf("write_files[%d]: permissions %q are not an octal mode such as 0600", i, f.Permissions))
		}
		switch f.Encoding {
		case "", "b64", "base64", "gz+b64", "gzip+base64", "text/plain":
		default:
			errs = append(errs, fmt.Errorf("write_files[%d]: encoding %q is not one cloud-init knows", i, f.Encoding))
		}
	}
	for i, u := range c.Users {
		if u.Name == "" {
			errs = append(errs, fmt.Errorf("users[%d]: name is required", i))
		}
	}
	for i, cmd := range append(append([]Command{}, c.BootCmd...), c.RunCmd...) {
		if len(cmd) == 0 {
			errs = append(errs, fmt.Errorf("command %d is empty", i))
		}
	}
	for i, m := range c.Mounts {
		// cc_mounts: a device, then up to five fstab fields.
		if len(m) == 0 || len(m) > 6 {
			errs = append(errs, fmt.Errorf("mounts[%d]: %q has %d fields, not 1 to 6 (device, mount point, type, options, dump, pass)", i, m, len(m)))
		}
	}
	walkStrings(reflect.ValueOf(c).Elem(), func(s string) {
		if !utf8.ValidString(s) {
			errs = append(errs, fmt.Errorf("%q is not UTF-8 text, which cloud-config is: encode such a file's content as base64", s))
		}
	})
	return errors.Join(errs...)
}

// walkStrings calls fn with each string in v.
func walkStrings(v reflect.Value, fn func(string)) {
	switch v.Kind() {
	case reflect.String:
		fn(v.String())
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walkStrings(v.Elem(), fn)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkStrings(v.Index(i), fn)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			walkStrings(it.Key(), fn)
			walkStrings(it.Value(), fn)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			walkStrings(v.Field(i), fn)
		}
	}
}

// eachString calls fn with each string the document holds.
func (c *Config) eachString(fn func(string)) { walkStrings(reflect.ValueOf(c).Elem(), fn) }

func octalMode(s string) bool {
	s = strings.TrimPrefix(s, "0")
	if len(s) == 0 || len(s) > 4 {
		return s == ""
	}
	for _, r := range s {
		if r < '0' || r > '7' {
			return false
		}
	}
	return true
}

// RenderJinja validates c and returns the cloud-config document as a
// Jinja template, JinjaHeader first. The contents of files without an
// encoding and the arguments of commands are templates (ParseTemplate; an
// error names the value and wraps errTemplate); every other value is
// literal. Whatever the values hold and the instance data says, the
// document cloud-init reads after Jinja has the structure of c, each
// template rendered alone in its place (jinja.go).
func (c *Config) RenderJinja() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("cloud-config: %w", err)
	}
	// Template values are written through placeholders that no value of
	// the document holds.
	var prefix string
	for k := 0; prefix == ""; k++ {
		prefix = "\x00jinja" + strconv.Itoa(k) + ":"
		c.eachString(func(s string) {
			if strings.Contains(s, prefix) {
				prefix = ""
			}
		})
	}
	tpl := templates{}
	expand := func(what string, v *string) error {
		if !jinja(*v) {
			return nil
		}
		parts, err := ParseTemplate(*v)
		if err != nil {
			return fmt.Errorf("cloud-config: %s: %w", what, err)
		}
		if len(parts) == 1 && parts[0].Ref == nil {
			*v = parts[0].Text
			return nil
		}
		if len(parts) == 0 {
			*v = ""
			return nil
		}
		key := prefix + strconv.Itoa(len(tpl))
		tpl[key], *v = parts, key
		return nil
	}
	out := *c
	out.WriteFiles = slices.Clone(c.WriteFiles)
	for i := range out.WriteFiles {
		if f := &out.WriteFiles[i]; f.Encoding == "" {
			if err := expand("write_files "+f.Path, &f.Content); err != nil {
				return nil, err
			}
		}
	}
	for _, cmds := range []*[]Command{&out.BootCmd, &out.RunCmd} {
		*cmds = slices.Clone(*cmds)
		for i := range *cmds {
			(*cmds)[i] = slices.Clone((*cmds)[i])
			for j := range (*cmds)[i] {
				if err := expand(fmt.Sprintf("command %q", (*cmds)[i]), &(*cmds)[i][j]); err != nil {
					return nil, err
				}
			}
		}
	}
	doc, err := out.encode(tpl)
	if err != nil {
		return nil, err
	}
	return append([]byte(JinjaHeader), doc...), nil
}

// encode writes c, tpl's placeholders as their templates.
func (c *Config) encode(tpl templates) ([]byte, error) {
	j, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding cloud-config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("encoding cloud-config: %w", err)
	}
	return append([]byte(header), encode(doc, tpl)...), nil
}
