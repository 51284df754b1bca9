package render

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

var testCAHash = "sha256:" + strings.Repeat("ab", 32)

// attestedJoin is a joining worker's attested input.
func attestedJoin(format bootstrapv1.Format, endpoints ...string) Input {
	return Input{Spec: &bootstrapv1.KubeadmConfigSpec{Format: format, Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: endpoints}},
		Role: RoleJoin, KubernetesVersion: "v1.36.4", Arch: "amd64", ClusterCAHash: testCAHash}
}

// envLine matches what systemd's EnvironmentFile reads as one assignment
// whose value no quote, backslash or dollar can end or expand.
var envLine = regexp.MustCompile(`^GATEHOUSE_BOOTSTRAPPER_ARGS="([^"\\$\n]*)"$`)

// bootstrapperArgsOf reads the environment file of attested data: exactly
// one assignment, and the arguments the unit's $GATEHOUSE_BOOTSTRAPPER_ARGS
// splits it into.
func bootstrapperArgsOf(t *testing.T, format bootstrapv1.Format, data []byte) []string {
	t.Helper()
	path := BootstrapperEnvPathFor(format)
	env := string(rendertest.Files(t, format, data)[path])
	lines := strings.Split(strings.TrimSuffix(env, "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("%s holds %d lines:\n%s", path, len(lines), env)
	}
	m := envLine.FindStringSubmatch(lines[0])
	if m == nil {
		t.Fatalf("%s is not one plain assignment: %q", path, lines[0])
	}
	return strings.Fields(m[1])
}

// TestAttestedInjection: every value attested mode writes into the
// bootstrapper's environment file or a unit is validated, and what is
// written cannot end the line, the quotes or a flag. Hostile values (a
// quote and a newline, empty, spaces, extra flags, lists in one entry) are
// refused; valid ones arrive as exactly the expected arguments.
func TestAttestedInjection(t *testing.T) {
	hostileEndpoints := []string{
		"10.0.0.1:9090\"\nEVIL=1", "10.0.0.1:9090\n--control-plane", "", " ", "10.0.0.1 :9090", "10.0.0.1:9090 --control-plane",
		"10.0.0.1:9090,10.0.0.2:9090", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:09090", "-evil:9090",
		"[fe80::1%eth0]:9090", "fe80::1:9090", "$(reboot):9090", "a\\b:9090", "host_name:9090",
	}
	hostileHashes := []string{
		testCAHash + "\"\nEVIL=1", "", " ", "sha256:", "sha256:ab", "sha256: " + strings.Repeat("ab", 32), strings.ToUpper(testCAHash),
		testCAHash + " --control-plane", strings.Repeat("ab", 32),
	}
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		t.Run(string(format), func(t *testing.T) {
			for _, ep := range hostileEndpoints {
				if _, err := Render(attestedJoin(format, "10.0.0.9:9090", ep)); err == nil || !strings.Contains(err.Error(), "joinEndpoints[1]") {
					t.Errorf("join endpoint %q: %v, want a refusal naming it", ep, err)
				}
			}
			if _, err := Render(attestedJoin(format)); err == nil {
				t.Error("an attested join without endpoints rendered")
			}
			for _, h := range hostileHashes {
				in := attestedJoin(format, "10.0.0.9:9090")
				in.ClusterCAHash = h
				if _, err := Render(in); err == nil || !strings.Contains(err.Error(), "CA hash") {
					t.Errorf("CA hash %q: %v, want a refusal", h, err)
				}
			}

			in := attestedJoin(format, "10.0.0.9:9090", "[2001:db8::1]:9090", "join.example.com:443")
			in.ControlPlane = true
			data, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "bootstrapper arguments", bootstrapperArgsOf(t, format, data), []string{
				"--success-file", sentinelPath, "--join-endpoints", "10.0.0.9:9090,[2001:db8::1]:9090,join.example.com:443",
				"--cluster-ca-hash", testCAHash, "--control-plane"})
		})
	}

	// The units attested Ignition data writes: a mount's values are refused
	// when they could break the unit, and escaped where systemd would
	// expand them.
	for _, m := range []cabpkv1.MountPoints{
		{"/dev/vdb\"\nExecStartPre=/bin/evil", "/mnt/data"}, {"/dev/vdb", "/mnt/data\"\n[Service]"}, {"/dev/vdb", "/mnt/data", "ext4", "defaults\"\nX=1"},
		{"/dev/vdb", "/mnt/data", "ext4\nX=1"}, {"", "/mnt/data"}, {"/dev/vdb", ""}, {"/dev/vdb", " "}, {" /dev/vdb", "/mnt/data"},
		{"/dev/vdb", "/mnt/data", "ext4", " defaults"},
	} {
		in := attestedJoin(bootstrapv1.FormatIgnition, "10.0.0.9:9090")
		in.Spec.Mounts = []cabpkv1.MountPoints{m}
		if _, err := Render(in); err == nil {
			t.Errorf("mount %q rendered", []string(m))
		}
	}
	in := attestedJoin(bootstrapv1.FormatIgnition, "10.0.0.9:9090")
	in.Spec.Mounts = []cabpkv1.MountPoints{{"/dev/vdb", "/mnt/my-data", "ext4", "x-systemd.description=%n"}}
	data, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, "mount unit", unitSettings(t, rendertest.Ignition(t, data), `mnt-my\x2ddata.mount`), map[string]string{
		"What": "/dev/vdb", "Where": "/mnt/my-data", "Type": "ext4", "Options": "x-systemd.description=%%n", "RequiredBy": "local-fs.target"})
}

// TestAttestedDataSize: a joining worker's attested data stays within
// maxAttestedDataSize raw in both formats (it was 2,215 bytes of
// cloud-config and 3,639 of Ignition with the install script the
// bootstrapper does not need); Ignition enables the bootstrapper's unit
// instead of running a script.
func TestAttestedDataSize(t *testing.T) {
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for _, cp := range []bool{false, true} {
			in := attestedJoin(format, "10.0.0.10:9090", "10.0.0.11:9090")
			in.ControlPlane = cp
			data, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s attested join (control plane %v): %d bytes", format, cp, len(data))
			if len(data) > maxAttestedDataSize {
				t.Errorf("%s attested join (control plane %v): %d bytes, more than %d", format, cp, len(data), maxAttestedDataSize)
			}
			files := rendertest.Files(t, format, data)
			if _, ok := files[installScriptPath]; ok {
				t.Errorf("%s attested data carries the install script", format)
			}
			if format == bootstrapv1.FormatIgnition {
				cfg := rendertest.Ignition(t, data)
				if !slices.ContainsFunc(cfg.Systemd.Units, func(u types.Unit) bool { return u.Name == bootstrapperUnit && u.Enabled != nil && *u.Enabled }) ||
					len(cfg.Systemd.Units) != 1 {
					t.Errorf("Ignition units %+v, want only %s enabled", cfg.Systemd.Units, bootstrapperUnit)
				}
			}
		}
	}
}
