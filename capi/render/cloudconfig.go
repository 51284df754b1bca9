package render

import (
	"github.com/gatehouse-dev/gatehouse/capi/render/cloudinit"
)

// jinjaHeader is the first line of cloud-config data, before
// "#cloud-config": cloud-init renders the document as a Jinja template
// with the instance's metadata before reading it, so references such as
// {{ ds.meta_data.local_hostname }} in the kubeadm configuration, files'
// contents or commands expand (CABPK's header; cloud-init's "Instance
// metadata" documentation). Every other value is literal, and no value can
// change the document's structure (package cloudinit's
// RenderJinja; docs/capi.md, "Who may write a KubeadmConfig").
const jinjaHeader = cloudinit.JinjaHeader

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
	return c.RenderJinja()
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
