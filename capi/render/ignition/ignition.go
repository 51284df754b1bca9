// Package ignition renders Ignition v3 configurations (spec 3.5.0) with
// coreos/ignition's own config types and validator, and merges in user
// additions written in Butane. Commands run from a oneshot systemd unit,
// as Ignition itself runs nothing.
package ignition

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/coreos/butane/config"
	"github.com/coreos/butane/config/common"
	ignition "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
)

// Version is the Ignition specification version rendered.
const Version = "3.5.0"

// Paths of the command runner.
const (
	// ScriptPath holds the commands, run in order by CommandsUnit.
	ScriptPath = "/etc/gatehouse/bootstrap-commands.sh"
	// CommandsUnit runs ScriptPath once, after the network is up.
	CommandsUnit = "gatehouse-bootstrap-commands.service"
)

// Spec is what a bootstrap writes and runs.
type Spec struct {
	Files []File
	Users []User
	// Commands run in order, each an argv, with a failure stopping the rest.
	Commands [][]string
	// Filesystems are created on the given devices.
	Filesystems []Filesystem
	// ButaneAdditions is Butane YAML (any variant Butane knows, e.g. fcos
	// 1.6.0) translated and merged over the rendered configuration.
	ButaneAdditions string
}

// File is one file; Mode is e.g. 0o600.
type File struct {
	Path     string
	Contents []byte
	Mode     int
	Owner    string
}

// User is a user account.
type User struct {
	Name              string
	Groups            []string
	Shell             string
	SSHAuthorizedKeys []string
}

// Filesystem formats Device with Format and mounts it at Path (by a
// systemd mount unit Ignition writes).
type Filesystem struct {
	Device, Format, Label, Path string
}

// Render returns the Ignition configuration of s as JSON after
// coreos/ignition validated it; a fatal report is an error naming the
// problems.
func Render(s Spec) ([]byte, error) {
	cfg := types.Config{Ignition: types.Ignition{Version: Version}}
	for _, f := range s.Files {
		cfg.Storage.Files = append(cfg.Storage.Files, file(f))
	}
	if len(s.Commands) > 0 {
		script := []byte("#!/bin/sh\nset -eu\n" + shellScript(s.Commands))
		cfg.Storage.Files = append(cfg.Storage.Files, file(File{Path: ScriptPath, Contents: script, Mode: 0o700}))
		cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{
			Name:    CommandsUnit,
			Enabled: ptr.To(true),
			Contents: ptr.To("[Unit]\nDescription=Gatehouse bootstrap commands\nWants=network-online.target\nAfter=network-online.target\n" +
				"ConditionPathExists=!/run/cluster-api/bootstrap-success.complete\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=" +
				ScriptPath + "\n\n[Install]\nWantedBy=multi-user.target\n"),
		})
	}
	for _, u := range s.Users {
		pu := types.PasswdUser{Name: u.Name}
		for _, g := range u.Groups {
			pu.Groups = append(pu.Groups, types.Group(g))
		}
		if u.Shell != "" {
			pu.Shell = ptr.To(u.Shell)
		}
		for _, k := range u.SSHAuthorizedKeys {
			pu.SSHAuthorizedKeys = append(pu.SSHAuthorizedKeys, types.SSHAuthorizedKey(k))
		}
		cfg.Passwd.Users = append(cfg.Passwd.Users, pu)
	}
	for _, fs := range s.Filesystems {
		f := types.Filesystem{Device: fs.Device, Format: ptr.To(fs.Format), WipeFilesystem: ptr.To(false)}
		if fs.Label != "" {
			f.Label = ptr.To(fs.Label)
		}
		if fs.Path != "" {
			f.Path = ptr.To(fs.Path)
			cfg.Systemd.Units = append(cfg.Systemd.Units, mountUnit(fs))
		}
		cfg.Storage.Filesystems = append(cfg.Storage.Filesystems, f)
	}
	if strings.TrimSpace(s.ButaneAdditions) != "" {
		additions, err := translateButane(s.ButaneAdditions)
		if err != nil {
			return nil, err
		}
		cfg = ignition.Merge(cfg, additions)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if _, report, err := ignition.Parse(out); err != nil {
		return nil, fmt.Errorf("the rendered Ignition config is invalid: %w: %s", err, report.String())
	} else if report.IsFatal() {
		return nil, fmt.Errorf("the rendered Ignition config is invalid: %s", report.String())
	}
	return out, nil
}

func file(f File) types.File {
	src := "data:;base64," + base64.StdEncoding.EncodeToString(f.Contents)
	out := types.File{
		Node:          types.Node{Path: f.Path, Overwrite: ptr.To(true)},
		FileEmbedded1: types.FileEmbedded1{Contents: types.Resource{Source: &src}, Mode: ptr.To(f.Mode)},
	}
	if user, group, ok := strings.Cut(f.Owner, ":"); f.Owner != "" {
		out.User.Name = ptr.To(user)
		if ok {
			out.Group.Name = ptr.To(group)
		}
	}
	return out
}

// shellScript quotes each argv for sh.
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

// mountUnit mounts fs at its path (systemd.mount(5): the unit name is the
// escaped path).
func mountUnit(fs Filesystem) types.Unit {
	name := strings.ReplaceAll(strings.Trim(fs.Path, "/"), "-", "\\x2d")
	name = strings.ReplaceAll(name, "/", "-") + ".mount"
	what := fs.Device
	if fs.Label != "" {
		what = "/dev/disk/by-label/" + fs.Label
	}
	return types.Unit{Name: name, Enabled: ptr.To(true), Contents: ptr.To(fmt.Sprintf(
		"[Mount]\nWhat=%s\nWhere=%s\nType=%s\n\n[Install]\nRequiredBy=local-fs.target\n", what, fs.Path, fs.Format))}
}

// translateButane turns Butane YAML into an Ignition config.
func translateButane(butane string) (types.Config, error) {
	out, report, err := config.TranslateBytes([]byte(butane), common.TranslateBytesOptions{})
	if err != nil {
		return types.Config{}, fmt.Errorf("translating the Butane additions: %w", err)
	}
	if report.IsFatal() {
		return types.Config{}, fmt.Errorf("translating the Butane additions: %s", report.String())
	}
	cfg, report2, err := ignition.ParseCompatibleVersion(out)
	if err != nil {
		return types.Config{}, fmt.Errorf("the Butane additions translate to an Ignition version this renderer cannot merge (%w): use a Butane variant version producing Ignition %s or older", err, Version)
	}
	if report2.IsFatal() {
		return types.Config{}, errors.New(report2.String())
	}
	return cfg, nil
}
