package render

import (
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapdata/cloudinit"
)

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
	return c.Render()
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
