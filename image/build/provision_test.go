package build

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProvisionScript runs the image's provisioning script against fw_cfg
// entries in a directory (what QEMU's -fw_cfg shows the guest) and checks
// what it hands the bootstrapper, and what it refuses.
func TestProvisionScript(t *testing.T) {
	script, err := recipeFS.ReadFile(recipeRoot + "/usr/lib/gatehouse/provision")
	if err != nil {
		t.Fatal(err)
	}
	const hash = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name    string
		entries map[string]string
		wantEnv string // bootstrapper.env
		wantErr string // in the script's standard error, exit status 1
		files   map[string]string
		network bool // `provision network`: the static address, no bootstrapper.env
	}{
		{
			name:    "nothing provisioned: the node waits for gatehouse init",
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS=\n",
		},
		{
			name:    "join endpoints and CA hash",
			entries: map[string]string{"join-endpoints": "10.0.2.2:9090\n# a comment\n", "cluster-ca-hash": hash + "\n"},
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS=--join-endpoints-file=RUN/join-endpoints --cluster-ca-hash=" + hash + "\n",
			files:   map[string]string{"RUN/join-endpoints": "10.0.2.2:9090\n# a comment\n"},
		},
		{
			name:    "endpoints without a CA hash are refused",
			entries: map[string]string{"join-endpoints": "10.0.2.2:9090\n"},
			wantErr: "join-endpoints and cluster-ca-hash come together",
		},
		{
			name:    "a malformed CA hash is refused",
			entries: map[string]string{"join-endpoints": "10.0.2.2:9090\n", "cluster-ca-hash": "sha256:XYZ"},
			wantErr: "cluster-ca-hash is not sha256:<64 lowercase hex digits>",
		},
		{
			name:    "allowed bootstrapper flags",
			entries: map[string]string{"bootstrapper-args": "--image-repository=10.0.2.2:5000/k8s --ignore-preflight-errors=FileExisting-crictl\n--kubelet-arg=node-labels=tier=web"},
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS= --image-repository=10.0.2.2:5000/k8s --ignore-preflight-errors=FileExisting-crictl --kubelet-arg=node-labels=tier=web\n",
		},
		{
			// The timing flags a slow (emulated) control plane needs; the
			// bootstrapper bounds their values (cmd/gatehouse-bootstrapper).
			name:    "the control plane's timing flags",
			entries: map[string]string{"bootstrapper-args": "--control-plane-wait=20m\n--leader-election-lease=60s\n"},
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS= --control-plane-wait=20m --leader-election-lease=60s\n",
		},
		{
			name:    "a leader-election flag of the components' own is refused",
			entries: map[string]string{"bootstrapper-args": "--leader-elect=false"},
			wantErr: "bootstrapper-args: --leader-elect=false is not allowed",
		},
		{
			name:    "a flag outside the list is refused",
			entries: map[string]string{"bootstrapper-args": "--log-level=debug --insecure-state-on-root-fs"},
			wantErr: "bootstrapper-args: --insecure-state-on-root-fs is not allowed",
		},
		{
			name:    "a flag without its value after = is refused",
			entries: map[string]string{"bootstrapper-args": "--image-repository registry.example"},
			wantErr: "bootstrapper-args: --image-repository is not allowed",
		},
		{
			name:    "init secret hash and containerd drop-in",
			entries: map[string]string{"init-secret.bcrypt": "$2a$10$abc", "containerd.toml": "version = 2\n"},
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS= --init-secret-hash-file=RUN/init-secret.bcrypt\n",
			files:   map[string]string{"RUN/init-secret.bcrypt": "$2a$10$abc", "RUN/containerd.d/50-provisioned.toml": "version = 2\n"},
		},
		{
			name:    "a CNI network",
			entries: map[string]string{"cni.conflist": `{"cniVersion": "1.0.0"}`},
			wantEnv: "GATEHOUSE_BOOTSTRAPPER_ARGS=\n",
			files:   map[string]string{"CNI/10-provisioned.conflist": `{"cniVersion": "1.0.0"}`},
		},
		{
			name:    "a static address, its gateway and DNS server",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\ngateway=10.88.5.1\n# a comment\ndns=10.88.5.1\n" +
				"route=10.244.0.0/24,10.88.5.10\nroute=10.244.1.0/24,10.88.5.11"},
			files: map[string]string{"NETWORKD/10-gatehouse-provisioned.network": "# From fw_cfg opt/gatehouse/network (gatehouse-provision-network.service).\n" +
				"[Match]\nName=en* eth*\n[Network]\nAddress=10.88.5.12/24\nGateway=10.88.5.1\nDNS=10.88.5.1\n" +
				"[Route]\nDestination=10.244.0.0/24\nGateway=10.88.5.10\n[Route]\nDestination=10.244.1.0/24\nGateway=10.88.5.11\n"},
		},
		{
			name:    "a host name",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\nhostname=worker-1\n"},
			files: map[string]string{
				"NETWORKD/10-gatehouse-provisioned.network": "# From fw_cfg opt/gatehouse/network (gatehouse-provision-network.service).\n" +
					"[Match]\nName=en* eth*\n[Network]\nAddress=10.88.5.12/24\n",
				"RUN/hostname": "worker-1\n",
			},
		},
		{
			name:    "a host name that is no RFC 1123 label",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\nhostname=Worker_1\n"},
			wantErr: "network: hostname=Worker_1 is not an RFC 1123 label",
		},
		{
			name:    "no network entry: DHCP's address",
			network: true,
		},
		{
			name:    "an address without its prefix is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12\n"},
			wantErr: "network: address=10.88.5.12 is not <IPv4>/<prefix>",
		},
		{
			name:    "an octet above 255 is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.256/24\n"},
			wantErr: "is not <IPv4>/<prefix>",
		},
		{
			name:    "a route without its gateway is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\nroute=10.244.0.0/24\n"},
			wantErr: "network: route=10.244.0.0/24 is not <IPv4>/<prefix>,<IPv4>",
		},
		{
			name:    "a gateway given twice is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\ngateway=10.88.5.1\ngateway=10.88.5.2\n"},
			wantErr: "network: gateway is given twice",
		},
		{
			name:    "an unknown key is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24\nmtu=9000\n"},
			wantErr: "network: a line is not address=, gateway=, dns=, hostname= or route=",
		},
		{
			name:    "a shell word in a value is refused",
			network: true,
			entries: map[string]string{"network": "address=10.88.5.12/24;reboot\n"},
			wantErr: "is not <IPv4>/<prefix>",
		},
		{
			name:    "no address is refused",
			network: true,
			entries: map[string]string{"network": "gateway=10.88.5.1\n"},
			wantErr: "network: no address=<IPv4>/<prefix>",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fwcfg, runDir := filepath.Join(dir, "fw_cfg"), filepath.Join(dir, "run")
			if err := os.MkdirAll(fwcfg, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, content := range tt.entries {
				if err := os.MkdirAll(filepath.Join(fwcfg, name), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(fwcfg, name, "raw"), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			networkd := filepath.Join(dir, "networkd")
			args := []string{"-c", string(script), "provision"}
			if tt.network {
				args = append(args, "network")
			}
			cmd := exec.CommandContext(t.Context(), "sh", args...)
			cmd.Env = append(os.Environ(), "GATEHOUSE_PROVISION_FWCFG="+fwcfg, "GATEHOUSE_PROVISION_RUN="+runDir,
				"GATEHOUSE_PROVISION_HOSTNAME=no", "GATEHOUSE_PROVISION_NETWORKD="+networkd, "GATEHOUSE_PROVISION_CNI="+filepath.Join(dir, "cni"))
			out, err := cmd.CombinedOutput()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(string(out), tt.wantErr) {
					t.Fatalf("err %v, output %q: want a failure saying %q", err, out, tt.wantErr)
				}
				if _, err := os.Stat(filepath.Join(runDir, "bootstrapper.env")); err == nil {
					t.Error("a refused provisioning wrote bootstrapper.env")
				}
				if _, err := os.Stat(networkd); err == nil {
					t.Error("a refused provisioning wrote a network file")
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if tt.network {
				if _, err := os.Stat(filepath.Join(runDir, "bootstrapper.env")); err == nil {
					t.Error("provision network wrote bootstrapper.env")
				}
				if len(tt.files) == 0 {
					if _, err := os.Stat(networkd); err == nil {
						t.Error("without a network entry, provision network wrote a network file")
					}
				}
				for name, want := range tt.files {
					got, err := os.ReadFile(strings.ReplaceAll(strings.ReplaceAll(name, "NETWORKD", networkd), "RUN", runDir))
					if err != nil || string(got) != want {
						t.Errorf("%s: %q (%v), want %q", name, got, err, want)
					}
				}
				return
			}
			env, err := os.ReadFile(filepath.Join(runDir, "bootstrapper.env"))
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.ReplaceAll(tt.wantEnv, "RUN", runDir); string(env) != want {
				t.Errorf("bootstrapper.env %q, want %q", env, want)
			}
			for name, want := range tt.files {
				path := strings.ReplaceAll(strings.ReplaceAll(name, "RUN", runDir), "CNI", filepath.Join(dir, "cni"))
				got, err := os.ReadFile(path)
				if err != nil || string(got) != want {
					t.Errorf("%s: %q (%v), want %q", name, got, err, want)
				}
			}
			if fi, err := os.Stat(filepath.Join(runDir, "init-secret.bcrypt")); err == nil && fi.Mode().Perm() != 0o600 {
				t.Errorf("the init secret hash has mode %v, want 0600", fi.Mode().Perm())
			}
		})
	}
}
