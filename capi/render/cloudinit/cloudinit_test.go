package cloudinit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
)

// render validates c and returns the cloud-config document without
// templates (RenderJinja's document when no value is a template, without
// JinjaHeader).
func (c *Config) render() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("cloud-config: %w", err)
	}
	return c.encode(nil)
}

// schemaCheck runs Debian's `cloud-init schema` on data.
func schemaCheck(t *testing.T, data []byte) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatal("cloud-init is not installed (Debian package cloud-init; make setup-test installs it)")
	}
	f := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "schema", "--config-file", f).CombinedOutput()
	return string(out), err
}

// shellLine is a command run by /bin/sh -c.
func shellLine(line string) Command { return Command{"/bin/sh", "-c", line} }

// kubeadmNode is what a kubeadm bootstrap renders: files, users, NTP,
// disks, mounts, commands and CABPK's success sentinel.
func kubeadmNode() *Config {
	return &Config{
		BootCmd: []Command{{"modprobe", "br_netfilter"}},
		WriteFiles: []File{
			{Path: "/run/kubeadm/kubeadm.yaml", Content: "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n", Owner: "root:root", Permissions: "0640"},
			{Path: "/etc/kubernetes/pki/ca.crt", Content: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", Permissions: "0644"},
			{Path: "/usr/local/bin/hello", Content: "IyEvYmluL3NoCmVjaG8gJ2hpJwo=", Encoding: "b64", Permissions: "0755"},
		},
		Users: []User{{Name: "ops", Groups: "sudo", Shell: "/bin/bash", LockPasswd: ptr.To(true), Sudo: "ALL=(ALL) NOPASSWD:ALL",
			SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG example"}}},
		NTP:       &NTP{Enabled: ptr.To(true), Servers: []string{"time.example.com"}},
		DiskSetup: map[string]DiskSetup{"/dev/vdb": {TableType: "gpt", Layout: true, Overwrite: ptr.To(false)}},
		FSSetup:   []FSSetup{{Label: "etcd", Filesystem: "ext4", Device: "/dev/vdb", Partition: "auto"}},
		Mounts:    [][]string{{"LABEL=etcd", "/var/lib/etcd"}},
		RunCmd: []Command{
			{"kubeadm", "init", "--config", "/run/kubeadm/kubeadm.yaml"},
			shellLine("mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"),
		},
	}
}

func TestRenderPassesCloudInitSchema(t *testing.T) {
	for name, c := range map[string]*Config{
		"kubeadm node":   kubeadmNode(),
		"files only":     {WriteFiles: []File{{Path: "/run/gatehouse/bootstrapper-userdata.env", Content: "GATEHOUSE_BOOTSTRAPPER_ARGS=\"--x\"\n"}}},
		"tricky strings": {WriteFiles: []File{{Path: "/etc/x", Content: "key: value\n- not a list\n'quotes' \"and\" #hash\n"}}, RunCmd: []Command{{"echo", "a: b", "#c"}}},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := c.render()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(data), header) {
				t.Fatalf("no %q header", header)
			}
			if out, err := schemaCheck(t, data); err != nil || !strings.Contains(out, "Valid cloud-config") {
				t.Fatalf("cloud-init schema: %v\n%s\n%s", err, out, data)
			}
		})
	}
}

// TestSchemaCheckCatchesErrors shows the check can fail: cloud-init
// refuses a document with a wrongly typed field.
func TestSchemaCheckCatchesErrors(t *testing.T) {
	out, err := schemaCheck(t, []byte(header+"ntp:\n  servers: time.example.com\n"))
	if err == nil || strings.Contains(out, "Valid cloud-config") {
		t.Fatalf("cloud-init schema accepted a string for ntp.servers:\n%s", out)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{WriteFiles: []File{{Path: "etc/x"}}}, "absolute and clean"},
		{Config{WriteFiles: []File{{Path: "/etc/../x"}}}, "absolute and clean"},
		{Config{WriteFiles: []File{{Path: "/x"}, {Path: "/x"}}}, "written twice"},
		{Config{WriteFiles: []File{{Path: "/x", Permissions: "0999"}}}, "octal"},
		{Config{WriteFiles: []File{{Path: "/x", Encoding: "rot13"}}}, "encoding"},
		{Config{Users: []User{{Shell: "/bin/sh"}}}, "name is required"},
		{Config{RunCmd: []Command{{}}}, "empty"},
	} {
		if _, err := tc.c.render(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.c, err, tc.want)
		}
	}
}
