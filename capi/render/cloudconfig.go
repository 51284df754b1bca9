package render

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/bootstrapdata/cloudinit"
)

// JinjaHeader is the first line of cloud-config data, before
// "#cloud-config": cloud-init renders the document as a Jinja template
// with the instance's metadata before reading it, so values such as
// {{ ds.meta_data.local_hostname }} in the kubeadm configuration, files or
// commands expand (CABPK's header; cloud-init's "Instance metadata"
// documentation).
const JinjaHeader = "## template: jinja\n"

// renderCloudConfig maps the plan to cloud-init's modules the way CABPK's
// cloud-config does.
func renderCloudConfig(s *steps) ([]byte, error) {
	c := &cloudinit.Config{}
	for _, f := range s.files {
		cf := cloudinit.File{Path: f.Path, Content: f.Content, Owner: f.Owner, Permissions: f.Permissions, Append: f.Append}
		switch f.Encoding {
		case EncodingBase64:
			cf.Encoding = "b64"
		case EncodingGzipBase64:
			cf.Encoding = "gz+b64"
		}
		c.WriteFiles = append(c.WriteFiles, cf)
	}
	for _, cmd := range s.bootCommands {
		c.BootCmd = append(c.BootCmd, cloudinit.Command(cmd))
	}
	if len(s.commands) > 0 {
		// runcmd is one sh script: stop at the first failure, as Ignition's
		// script does, so the success sentinel (last) is only written once
		// every command, kubeadm's among them, succeeded.
		c.RunCmd = append(c.RunCmd, cloudinit.Command{"set", "-e"})
	}
	for _, cmd := range s.commands {
		c.RunCmd = append(c.RunCmd, cloudinit.Command(cmd))
	}
	for _, u := range s.users {
		c.Users = append(c.Users, cloudinit.User{
			Name: u.Name, Gecos: u.Gecos, Groups: u.Groups, HomeDir: u.HomeDir, Shell: u.Shell,
			Passwd: u.Passwd, PrimaryGroup: u.PrimaryGroup, LockPasswd: u.LockPassword, Sudo: u.Sudo,
			Inactive: inactiveDays(u.Inactive), SSHAuthorizedKeys: u.SSHAuthorizedKeys,
		})
	}
	if s.ntp.IsDefined() {
		// Unset, cloud-init's ntp module is enabled; false skips it.
		c.NTP = &cloudinit.NTP{Enabled: s.ntp.Enabled, Servers: s.ntp.Servers}
	}
	if err := cloudInitDisks(c, s.disks); err != nil {
		return nil, err
	}
	for _, m := range s.mounts {
		c.Mounts = append(c.Mounts, []string(m))
	}
	var jinjaErr error
	c.Strings(func(v string) {
		if err := checkJinja(v); err != nil && jinjaErr == nil {
			jinjaErr = err
		}
	})
	if jinjaErr != nil {
		return nil, jinjaErr
	}
	out, err := c.Render()
	if err != nil {
		return nil, err
	}
	return append([]byte(JinjaHeader), out...), nil
}

// checkJinja refuses a value whose Jinja cloud-init could not render, or
// whose Jinja would reach beyond the value into the YAML around it: the
// whole document is one template, rendered before it is read. Each
// construct opened in the value must close in it, {% raw %} and blocks
// ({% if %}…{% endif %}) too (shell's ${#var}, for one, opens a Jinja
// comment); whitespace control (-) must not strip past the value's ends;
// a block tag or comment must not end a line of a value written as a YAML
// block, where Jinja would remove the line break after it (trim_blocks)
// and join the next line, indentation and all, or the YAML's next line. The
// value must be text YAML writes as it is, so that Jinja sees it as
// written. {% raw %}…{% endraw %} keeps text as it is.
func checkJinja(v string) error {
	if !strings.Contains(v, "{{") && !strings.Contains(v, "{%") && !strings.Contains(v, "{#") {
		return nil
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("the cloud-config is a Jinja template (%s) and the value %.80q %s: write literal text inside {%% raw %%}…{%% endraw %%}",
			strings.TrimSpace(JinjaHeader), v, fmt.Sprintf(format, args...))
	}
	if !cloudinit.Verbatim(v) {
		return fail("holds Jinja and characters YAML must escape, which Jinja would see escaped")
	}
	var blocks []string
	for i := 0; i < len(v)-1; i++ {
		closer, ok := map[string]string{"{{": "}}", "{%": "%}", "{#": "#}"}[v[i:i+2]]
		if !ok {
			continue
		}
		n := strings.Index(v[i+2:], closer)
		if n < 0 {
			return fail("opens %q without a %q (shell's ${#var}, for one, opens a Jinja comment)", v[i:i+2], closer)
		}
		inner, end := v[i+2:i+2+n], i+2+n+2
		if strings.HasPrefix(inner, "-") && strings.TrimSpace(v[:i]) == "" || strings.HasSuffix(inner, "-") && strings.TrimSpace(v[end:]) == "" {
			return fail("strips whitespace (-) past its own ends")
		}
		if closer == "%}" {
			words := strings.Fields(strings.Trim(inner, "-+"))
			switch tag := append(words, "")[0]; {
			case tag == "raw":
				m := rawEnd.FindStringIndex(v[end:])
				if m == nil {
					return fail("opens {%% raw %%} without {%% endraw %%}")
				}
				end += m[1]
			case jinjaBlocks[tag] && (tag != "set" || !strings.Contains(inner, "=")):
				blocks = append(blocks, tag)
			case strings.HasPrefix(tag, "end") && jinjaBlocks[tag[3:]]:
				if len(blocks) == 0 || blocks[len(blocks)-1] != tag[3:] {
					return fail("closes {%% %s %%} it did not open", tag)
				}
				blocks = blocks[:len(blocks)-1]
			}
		}
		if closer != "}}" && !strings.HasSuffix(inner, "-") && (v[end:] == "" || v[end] == '\n') && !cloudinit.SingleQuoted(v) {
			// The value is a block of the YAML, each line indented: the
			// next line would keep the YAML's indentation as content.
			return fail("ends a line with a block tag or comment, after which Jinja removes the line break (put the tag inside the line)")
		}
		i = end - 1
	}
	if len(blocks) > 0 {
		return fail("leaves {%% %s %%} open: a block must close in the value that opens it", blocks[len(blocks)-1])
	}
	return nil
}

// jinjaBlocks are the Jinja tags that open a block ended by end<tag>.
var jinjaBlocks = map[string]bool{"if": true, "for": true, "macro": true, "call": true, "filter": true, "block": true, "with": true,
	"autoescape": true, "set": true}

// inactiveDays is cloud-init's (and useradd's) inactive value for CABPK's
// inactive flag: "0", the account is disabled as soon as its password
// expires. CABPK writes the boolean itself, which cloud-init's schema
// refuses and its useradd call ignores.
func inactiveDays(inactive *bool) string {
	if inactive != nil && *inactive {
		return "0"
	}
	return ""
}

var rawEnd = regexp.MustCompile(`\{%[-+]?\s*endraw\s*[-+]?%\}`)
