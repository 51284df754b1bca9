package render

import (
	"bytes"
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
	cloudInitDisks(c, s.disks)
	for _, m := range s.mounts {
		c.Mounts = append(c.Mounts, []string(m))
	}
	out, err := c.Render()
	if err != nil {
		return nil, err
	}
	if err := checkJinja(out); err != nil {
		return nil, err
	}
	return append([]byte(JinjaHeader), out...), nil
}

// checkJinja refuses a document Jinja cannot parse because a delimiter is
// not closed: cloud-init would drop the whole user data at boot. Shell's
// ${#var}, for one, opens a Jinja comment; {% raw %}…{% endraw %} keeps
// text as it is.
func checkJinja(doc []byte) error {
	for i := 0; i < len(doc)-1; i++ {
		if doc[i] != '{' {
			continue
		}
		var closer string
		switch doc[i+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			continue
		}
		end := bytes.Index(doc[i+2:], []byte(closer))
		if end < 0 {
			return fmt.Errorf("the cloud-config is a Jinja template (%s) and line %d opens %q without a %q: "+
				"write %q inside {%% raw %%}…{%% endraw %%} (shell's ${#var}, for one, opens a Jinja comment)",
				strings.TrimSpace(JinjaHeader), bytes.Count(doc[:i], []byte("\n"))+2, doc[i:i+2], closer, doc[i:i+2])
		}
		tag := bytes.Trim(doc[i+2:i+2+end], " \t-+")
		i += 2 + end + 1
		if closer == "%}" && string(tag) == "raw" {
			// Skip to the closing tag, whose whitespace control may vary.
			m := rawEnd.FindIndex(doc[i:])
			if m == nil {
				return fmt.Errorf("the cloud-config is a Jinja template and a {%% raw %%} block is not closed by {%% endraw %%}")
			}
			i += m[1] - 1
		}
	}
	return nil
}

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
