package render

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

const kubeadmYAML = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n"

func spec(format bootstrapv1.Format) *bootstrapv1.KubeadmConfigSpec {
	return &bootstrapv1.KubeadmConfigSpec{
		Format:              format,
		BootCommands:        []string{"modprobe br_netfilter"},
		PreKubeadmCommands:  []string{"swapoff -a"},
		PostKubeadmCommands: []string{"echo joined"},
		Users:               []cabpkv1.User{{Name: "ops", Shell: "/bin/bash", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA ops"}}},
		NTP:                 cabpkv1.NTP{Servers: []string{"time.example.com"}},
		DiskSetup:           cabpkv1.DiskSetup{Filesystems: []cabpkv1.Filesystem{{Device: "/dev/vdb", Filesystem: "ext4", Label: "etcd"}}},
		Mounts:              []cabpkv1.MountPoints{{"LABEL=etcd", "/var/lib/etcd"}},
		Verbosity:           ptr.To(int32(5)),
	}
}

func input(s *bootstrapv1.KubeadmConfigSpec, role Role) Input {
	return Input{Spec: s, Role: role, KubeadmConfig: []byte(kubeadmYAML), KubernetesVersion: "v1.36.4", Arch: "amd64",
		Files: []File{{Path: "/etc/kubernetes/pki/ca.crt", Content: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", Permissions: "0644"}}}
}

func TestRender(t *testing.T) {
	release, err := versions.Resolve("v1.36.4")
	if err != nil {
		t.Fatal(err)
	}
	components, _ := release.Components("amd64")
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for _, role := range []Role{RoleInit, RoleJoin} {
			t.Run(string(format)+" "+string(role), func(t *testing.T) {
				data, err := Render(input(spec(format), role))
				if err != nil {
					t.Fatal(err)
				}
				if format == bootstrapv1.FormatCloudConfig {
					rendertest.CloudInitSchema(t, data)
				}
				text := rendertest.Text(t, format, data)
				for _, want := range []string{KubeadmConfigPathFor(format), "kind: JoinConfiguration", sentinelPath, "time.example.com",
					"ssh-ed25519 AAAA ops", "BEGIN CERTIFICATE", installScriptPath} {
					if !strings.Contains(text, want) {
						t.Errorf("data lacks %q", want)
					}
				}
				for _, c := range components {
					if !strings.Contains(text, c.URL) || !strings.Contains(text, strings.TrimPrefix(c.Hash, "sha256:")) {
						t.Errorf("the install script lacks %s with its digest", c.Name)
					}
				}
				// Order: pre-kubeadm, kubeadm <role> with verbosity, post-kubeadm, sentinel.
				order := []string{"swapoff -a", "kubeadm", string(role), "echo joined", "bootstrap-success.complete"}
				pos := 0
				for _, w := range order {
					i := strings.Index(text[pos:], w)
					if i < 0 {
						t.Fatalf("%q missing or out of order after position %d", w, pos)
					}
					pos += i
				}
			})
		}
	}
}

// TestAttestedDataHoldsNoSecrets scans every format's attested data for
// private keys, bootstrap tokens and certificate keys.
func TestAttestedDataHoldsNoSecrets(t *testing.T) {
	token := regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`)
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		s := spec(format)
		s.Attested = &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}
		in := input(s, RoleJoin)
		in.KubeadmConfig = nil
		in.ClusterCAHash = "sha256:" + strings.Repeat("ab", 32)
		data, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		if format == bootstrapv1.FormatCloudConfig {
			rendertest.CloudInitSchema(t, data)
		}
		text := rendertest.Text(t, format, data)
		for _, bad := range []string{"PRIVATE KEY", "certificateKey", "certificate-key", "kubeadm join", "\"kubeadm\",\"join\"", "'kubeadm' 'join'"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s attested data contains %q", format, bad)
			}
		}
		if m := token.FindString(text); m != "" {
			t.Errorf("%s attested data contains a bootstrap token %q", format, m)
		}
		if !strings.Contains(text, "gatehouse-bootstrapper.service") || !strings.Contains(text, "--join-endpoints 10.0.0.1:9090") {
			t.Errorf("%s attested data does not start the bootstrapper for the join service", format)
		}
		in.ClusterCAHash = ""
		if _, err := Render(in); err == nil || !strings.Contains(err.Error(), "CA hash") {
			t.Errorf("%s attested join without a CA pin: %v", format, err)
		}
		in.Role = RoleInit
		data, err = Render(in)
		if err != nil {
			t.Fatal(err)
		}
		if text := rendertest.Text(t, format, data); strings.Contains(text, "--join-endpoints") || !strings.Contains(text, "--success-file") {
			t.Errorf("%s attested init data should start the bootstrapper without join endpoints", format)
		}
	}
}

func TestRenderRefuses(t *testing.T) {
	in := input(spec(bootstrapv1.FormatCloudConfig), RoleJoin)
	in.KubernetesVersion = "v1.31.0"
	if _, err := Render(in); !errors.Is(err, ErrNoBaseTemplate) || !strings.Contains(err.Error(), "supported") {
		t.Fatalf("unsupported version: %v", err)
	}
	in = input(spec(bootstrapv1.FormatIgnition), RoleJoin)
	in.KubeadmConfig = nil
	if _, err := Render(in); err == nil {
		t.Fatal("rendered without a kubeadm configuration")
	}
	in = input(spec(bootstrapv1.FormatIgnition), RoleJoin)
	in.Files = append(in.Files, File{Path: "/x", Content: "y", Permissions: "rw"})
	if _, err := Render(in); err == nil || !strings.Contains(err.Error(), "permissions") {
		t.Fatalf("bad permissions: %v", err)
	}
	// What the fuzzer found (FuzzRender*): in both formats.
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for name, tc := range map[string]struct {
			edit func(*Input)
			want string
		}{
			"NTP server with a line break": {func(in *Input) { in.Spec.NTP.Servers = []string{"x iburst\nallow all"} }, "ntp.servers[0]"},
			"NTP server with options":      {func(in *Input) { in.Spec.NTP.Servers = []string{"x prefer"} }, "ntp.servers[0]"},
			"sudo rule continued":          {func(in *Input) { in.Spec.Users = []cabpkv1.User{{Name: "ops", Sudo: `ALL=(ALL) ALL \`}} }, "sudo rule"},
			"sudo rule on two lines":       {func(in *Input) { in.Spec.Users = []cabpkv1.User{{Name: "ops", Sudo: "ALL\nroot ALL=(ALL) ALL"}} }, "sudo rule"},
			"content not base64":           {func(in *Input) { in.Files = []File{{Path: "/x", Content: "!", Encoding: EncodingBase64}} }, "not base64"},
			"content not gzip":             {func(in *Input) { in.Files = []File{{Path: "/x", Content: "eA==", Encoding: EncodingGzipBase64}} }, "not gzip"},
			"unknown encoding":             {func(in *Input) { in.Files = []File{{Path: "/x", Content: "x", Encoding: "rot13"}} }, "unknown encoding"},
			"mount entry without fields":   {func(in *Input) { in.Spec.Mounts = []cabpkv1.MountPoints{nil} }, "mounts[0]"},
		} {
			in := input(spec(format), RoleJoin)
			in.Spec.Mounts, in.Spec.DiskSetup = nil, cabpkv1.DiskSetup{}
			tc.edit(&in)
			if _, err := Render(in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s, %s: %v, want an error naming %q", format, name, err, tc.want)
			}
		}
	}
}

// BenchmarkRender is the render time of one config per format and role,
// validation included (Ignition's validator runs inside Render).
func BenchmarkRender(b *testing.B) {
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for _, role := range []Role{RoleInit, RoleJoin} {
			b.Run(string(format)+"/"+string(role), func(b *testing.B) {
				in := input(spec(format), role)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Render(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
