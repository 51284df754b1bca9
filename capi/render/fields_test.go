package render

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapdata/ignition"
)

// The tests of this file check that each CABPK field reaches the data
// with its meaning, on the parsed cloud-config (after `cloud-init schema`)
// and the parsed Ignition config (after Ignition's validator).

// cloudConfig renders s as a join's cloud-config, checks it with
// `cloud-init schema` and returns it parsed.
func cloudConfig(t *testing.T, s *bootstrapv1.KubeadmConfigSpec) map[string]any {
	t.Helper()
	s.Format = bootstrapv1.FormatCloudConfig
	data, err := Render(input(s, RoleJoin))
	if err != nil {
		t.Fatal(err)
	}
	rendertest.CloudInitSchema(t, data)
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("parsing the cloud-config: %v", err)
	}
	return cfg
}

// ignitionConfig renders s as a join's Ignition config and returns it
// parsed by Ignition's validator, with the files it writes.
func ignitionConfig(t *testing.T, s *bootstrapv1.KubeadmConfigSpec) (types.Config, map[string][]byte) {
	t.Helper()
	s.Format = bootstrapv1.FormatIgnition
	data, err := Render(input(s, RoleJoin))
	if err != nil {
		t.Fatal(err)
	}
	return rendertest.Ignition(t, data), rendertest.Files(t, bootstrapv1.FormatIgnition, data)
}

// jsonValue is v as cloud-config's parsed YAML holds it.
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func assertEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %#v\nwant %#v", what, got, want)
	}
}

func usersSpec() *bootstrapv1.KubeadmConfigSpec {
	return &bootstrapv1.KubeadmConfigSpec{Users: []cabpkv1.User{
		{Name: "ops", Gecos: "Operations", Groups: "wheel, docker", HomeDir: "/home/operations", Inactive: ptr.To(true),
			Shell: "/bin/bash", Passwd: "$6$salt$hash", PrimaryGroup: "ops", LockPassword: ptr.To(false),
			Sudo: "ALL=(ALL) NOPASSWD:ALL", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA ops"}},
		{Name: "audit", LockPassword: ptr.To(true)},
	}}
}

// TestUsers: every field of a user reaches both formats (CABPK drops none
// in cloud-config; Ignition's users get what Ignition has fields for, sudo
// rules in sudoers.d and the password lock from the commands).
func TestUsers(t *testing.T) {
	t.Run("cloud-config", func(t *testing.T) {
		cfg := cloudConfig(t, usersSpec())
		assertEqual(t, "users", cfg["users"], jsonValue(t, []map[string]any{
			{"name": "ops", "gecos": "Operations", "groups": "wheel, docker", "homedir": "/home/operations", "inactive": "0",
				"shell": "/bin/bash", "passwd": "$6$salt$hash", "primary_group": "ops", "lock_passwd": false,
				"sudo": "ALL=(ALL) NOPASSWD:ALL", "ssh_authorized_keys": []string{"ssh-ed25519 AAAA ops"}},
			{"name": "audit", "lock_passwd": true},
		}))
	})
	t.Run("ignition", func(t *testing.T) {
		cfg, files := ignitionConfig(t, usersSpec())
		assertEqual(t, "users", cfg.Passwd.Users, []types.PasswdUser{
			{Name: "ops", Gecos: ptr.To("Operations"), Groups: []types.Group{"wheel", "docker"}, HomeDir: ptr.To("/home/operations"),
				Shell: ptr.To("/bin/bash"), PasswordHash: ptr.To("$6$salt$hash"), PrimaryGroup: ptr.To("ops"),
				SSHAuthorizedKeys: []types.SSHAuthorizedKey{"ssh-ed25519 AAAA ops"}},
			{Name: "audit"},
		})
		assertEqual(t, "sudoers", string(files[SudoersPath]), "ops ALL=(ALL) NOPASSWD:ALL\n")
		i := slices.IndexFunc(cfg.Storage.Files, func(f types.File) bool { return f.Path == SudoersPath })
		if mode := cfg.Storage.Files[i].Mode; mode == nil || *mode != 0o440 {
			t.Errorf("sudoers mode %v, want 0440", mode)
		}
		script := string(files[ignition.ScriptPath])
		for _, want := range []string{"'usermod' '--inactive' '0' 'ops'\n", "'usermod' '--lock' 'audit'\n"} {
			if !strings.Contains(script, want) {
				t.Errorf("the commands lack %q:\n%s", want, script)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, u := range []cabpkv1.User{
			{Name: "ops", Sudo: "ALL=(ALL) ALL\nroot ALL=(ALL) ALL"},
			{Name: "-o", LockPassword: ptr.To(true)},
			{Name: "a b", Sudo: "ALL=(ALL) ALL"},
		} {
			s := &bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition, Users: []cabpkv1.User{u}}
			if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "user") {
				t.Errorf("user %+v: %v, want a refusal", u, err)
			}
		}
		s := &bootstrapv1.KubeadmConfigSpec{Users: []cabpkv1.User{{Name: "ops",
			PasswdFrom: cabpkv1.PasswdSource{Secret: cabpkv1.SecretPasswdSource{Name: "s", Key: "k"}}}}}
		if _, err := Render(input(s, RoleJoin)); err == nil || !strings.Contains(err.Error(), "passwdFrom") {
			t.Errorf("an unresolved passwdFrom rendered: %v", err)
		}
	})
}

// TestNTP: ntp.enabled reaches cloud-init as given (unset means enabled);
// false configures nothing in Ignition either.
func TestNTP(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ntp        cabpkv1.NTP
		cloud      map[string]any
		chronyConf string
	}{
		{"servers", cabpkv1.NTP{Servers: []string{"time.example.com"}},
			map[string]any{"servers": []any{"time.example.com"}}, "server time.example.com iburst\n"},
		{"disabled", cabpkv1.NTP{Enabled: ptr.To(false), Servers: []string{"time.example.com"}},
			map[string]any{"enabled": false, "servers": []any{"time.example.com"}}, ""},
		{"enabled with the image's servers", cabpkv1.NTP{Enabled: ptr.To(true)}, map[string]any{"enabled": true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertEqual(t, "ntp", cloudConfig(t, &bootstrapv1.KubeadmConfigSpec{NTP: tc.ntp})["ntp"], tc.cloud)
			_, files := ignitionConfig(t, &bootstrapv1.KubeadmConfigSpec{NTP: tc.ntp})
			assertEqual(t, "chrony configuration", string(files[ChronyConfPath]), tc.chronyConf)
		})
	}
}
