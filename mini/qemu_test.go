package mini

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// TestProvisionVM: a VM node's fw_cfg entries give it its address with
// routes to the other nodes' pods, where to join, its name, the registry
// mirror and its pods' network; the first control plane gets the init
// secret's hash and nothing to join.
func TestProvisionVM(t *testing.T) {
	dir := t.TempDir()
	hash := filepath.Join(dir, "init-secret.bcrypt")
	if err := os.WriteFile(hash, []byte("$2a$10$hash"), 0o600); err != nil {
		t.Fatal(err)
	}
	worker := &NodeSpec{Network: 5, PauseImage: ImageRepository + "/pause:3.10", InitSecretHashFile: hash,
		JoinEndpoints: []string{"10.88.5.10:9090"}, CACertHash: "sha256:" + strings.Repeat("ab", 32)}
	worker.Gateway = worker.Network.HostIP()
	worker.place(dir, 1, "worker-1")
	entries, err := provisionVM(worker)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(e.File)
		if err != nil {
			t.Fatal(err)
		}
		got[strings.TrimPrefix(e.Name, "opt/gatehouse/")] = string(data)
	}
	for entry, want := range map[string][]string{
		"network":           {"address=10.88.5.11/24\n", "gateway=10.88.5.1\n", "dns=10.88.5.1\n", "hostname=worker-1\n", "route=10.244.0.0/24,10.88.5.10\n"},
		"join-endpoints":    {"10.88.5.10:9090\n"},
		"cluster-ca-hash":   {worker.CACertHash},
		"bootstrapper-args": {"--node-name=worker-1\n", "--image-repository=" + ImageRepository + "\n"},
		"containerd.toml":   {`sandbox_image = "docker.io/local/pause:3.10"`, `mirrors."docker.io"]`, `endpoint = ["http://10.88.5.1:5000"]`},
		"cni.conflist":      {`"subnet": "10.244.1.0/24"`},
	} {
		for _, w := range want {
			if !strings.Contains(got[entry], w) {
				t.Errorf("entry %s lacks %q:\n%s", entry, w, got[entry])
			}
		}
	}
	if strings.Contains(got["network"], "route=10.244.1.0/24") {
		t.Error("the node routes its own pod range through another node")
	}
	if _, ok := got["init-secret.bcrypt"]; ok {
		t.Error("a joining worker got the init secret's hash")
	}

	cp := *worker
	cp.place(dir, 0, "cp-0")
	cp.ControlPlane, cp.Init, cp.JoinEndpoints, cp.CACertHash = true, true, nil, ""
	entries, err = provisionVM(&cp)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimPrefix(e.Name, "opt/gatehouse/"))
	}
	if !slices.Contains(names, "init-secret.bcrypt") || slices.Contains(names, "join-endpoints") {
		t.Errorf("the first control plane's entries: %v; want the init secret's hash and no join endpoints", names)
	}
	args, err := os.ReadFile(filepath.Join(vmDir(cp.Dir), "provision", "bootstrapper-args"))
	if err != nil || !strings.Contains(string(args), "--control-plane-wait=20m\n--leader-election-lease=60s\n") {
		t.Errorf("the control plane's bootstrapper-args %q (%v) give kubeadm no longer wait for its API server", args, err)
	}
	if strings.Contains(got["bootstrapper-args"], "control-plane-wait") {
		t.Errorf("a worker's bootstrapper-args set a control-plane wait: %q", got["bootstrapper-args"])
	}

	// A mirror-images VM: the upstream pause image, and containerd reads
	// the hosts files the bootstrapper writes; no registry mirror.
	mw := *worker
	mw.MirrorImages = true
	if _, err := provisionVM(&mw); err != nil {
		t.Fatal(err)
	}
	toml, err := os.ReadFile(filepath.Join(vmDir(mw.Dir), "provision", "containerd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`sandbox_image = "registry.k8s.io/pause:3.10"`, `config_path = "` + nodeContainerdHostsDir + `"`} {
		if !strings.Contains(string(toml), want) {
			t.Errorf("a mirror-images VM's containerd.toml lacks %s:\n%s", want, toml)
		}
	}
	if strings.Contains(string(toml), "mirrors") || strings.Contains(string(toml), ImageRepository) {
		t.Errorf("a mirror-images VM's containerd.toml keeps the registry mirror or the local images:\n%s", toml)
	}
}

// TestAcceptVMNodes: with the node image's signed values, the cluster
// policy gives each role to a namespace node and to a VM of that role, and
// to nothing else: a VM worker is no control plane, a namespace node's
// values are no VM's. Values whose signature does not verify are refused.
func TestAcceptVMNodes(t *testing.T) {
	value := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	nsCommon, nsCP, nsWorker := value(1), value(2), value(3)
	vmCP := map[uint32][]byte{0: value(9), 4: value(10), 11: value(11)}
	vmWorker := map[uint32][]byte{0: value(9), 4: value(20), 11: value(21)}
	toM := func(m map[uint32][]byte) measurements.M {
		out := measurements.M{}
		for i, v := range m {
			out[i] = measurements.Measurement{Expected: v}
		}
		return out
	}
	image := t.TempDir()
	priv, pub, err := signedvalues.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key, err := signedvalues.ParsePrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := signedvalues.Sign(t.Context(), signedvalues.Values{Platform: "qemu-ovmf",
		Image: signedvalues.Image{Name: "gatehouse-node", Version: "1", ManifestSHA256: strings.Repeat("a", 64), RootHash: strings.Repeat("b", 64)},
		Roles: map[policy.Role]measurements.M{policy.RoleControlPlane: toM(vmCP), policy.RoleWorker: toM(vmWorker)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{imageSignedValues: signed, imageVerifyKey: pub} {
		if err := os.WriteFile(filepath.Join(image, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hexJSON := func(pcr string, v []byte) string { return `{"` + pcr + `": {"expected": "` + string(hexOf(v)) + `"}}` }
	tv := clusterconfig.TemplateValues{Name: "mini", KubernetesVersion: "v1.36.4", PCRs: PCRs,
		ReferenceValues:     hexJSON("4", nsCommon),
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: hexJSON("8", nsCP), policy.RoleWorker: hexJSON("8", nsWorker)},
		EKRoots:             string(testkit.NewCA(t, "root").PEM), ServiceCIDR: serviceCIDR, PodCIDR: "10.244.0.0/16"}
	if err := acceptVMNodes(t.Context(), &tv, image); err != nil {
		t.Fatal(err)
	}
	data, err := clusterconfig.Generate(tv)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := clusterconfig.Load(path)
	if err != nil {
		t.Fatalf("%v:\n%s", err, data)
	}
	if cfg.Attestation.RequireEventLog == nil || *cfg.Attestation.RequireEventLog {
		t.Error("the policy requires an event log, which namespace nodes do not have")
	}
	a, err := cfg.Attestation.Appraisal(nil, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		measured map[uint32][]byte
		want     []policy.Role
	}{
		{"namespace control plane", map[uint32][]byte{4: nsCommon, 8: nsCP}, []policy.Role{policy.RoleControlPlane}},
		{"namespace worker", map[uint32][]byte{4: nsCommon, 8: nsWorker}, []policy.Role{policy.RoleWorker}},
		{"VM control plane", vmCP, []policy.Role{policy.RoleControlPlane}},
		{"VM worker", vmWorker, []policy.Role{policy.RoleWorker}},
		{"VM worker's firmware with the control plane's UKI of another", map[uint32][]byte{0: value(9), 4: value(10), 11: value(21)}, nil},
		{"namespace worker's PCR 8 beside a VM's PCR 4", map[uint32][]byte{0: value(9), 4: value(20), 8: nsWorker}, nil},
	}
	for _, tt := range tests {
		if got := a.Roles(tt.measured); !slices.Equal(got, tt.want) {
			t.Errorf("%s: roles %v, want %v", tt.name, got, tt.want)
		}
	}

	// Values signed by another key are refused.
	_, otherPub, err := signedvalues.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, imageVerifyKey), otherPub, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := acceptVMNodes(context.Background(), &clusterconfig.TemplateValues{}, image); err == nil {
		t.Fatal("values whose signature does not verify with the image's key were accepted")
	}
}

func hexOf(b []byte) []byte {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return out
}

// TestQEMUProviderBasics: no shell on a VM, its logs are its console's,
// and a node without a VM record stops and deletes as nothing.
func TestQEMUProviderBasics(t *testing.T) {
	p := &qemuNodes{}
	nr := &NodeRecord{Name: "worker-1", Dir: filepath.Join(t.TempDir(), "worker-1")}
	if _, err := p.Exec(t.Context(), nr, "true"); !errors.Is(err, ErrNoExec) {
		t.Errorf("Exec: %v, want ErrNoExec", err)
	}
	if logs := p.Logs(nr); logs[0] != filepath.Join(nr.Dir, "vm", "console.log") {
		t.Errorf("Logs: %v", logs)
	}
	if err := p.Stop(t.Context(), nr); err != nil {
		t.Errorf("Stop without a VM: %v", err)
	}
	if err := p.Delete(t.Context(), nr); err != nil {
		t.Errorf("Delete without a VM: %v", err)
	}
	if vmProcessAlive(os.Getpid(), nr.Dir) {
		t.Error("this test's process is taken for the VM's")
	}
}

// TestVMContainerdDropIn: containerd (the image's 1.6, as Debian ships it
// to this host too) merges a VM's drop-in into the image's configuration
// so that only the sandbox image and the registry configuration change;
// the image's other CRI settings, the systemd cgroup driver the kubelet
// uses among them, stay. containerd 1.6 replaces a plugin's table with an
// imported file's: a drop-in with only its own keys left runc on cgroupfs.
// A mirror-images VM keeps the image's hosts files directory (config_path),
// where its bootstrapper (the image's --containerd-hosts-dir) writes the
// image mirror's hosts files; a VM with the registry mirror loses it,
// since containerd refuses both.
func TestVMContainerdDropIn(t *testing.T) {
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		t.Fatalf("containerd (make setup-test installs it): %v", err)
	}
	base, err := os.ReadFile("../image/build/recipe/rootfs/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	const imageImports = `imports = ["/run/gatehouse/containerd.d/*.toml"]`
	if !bytes.Contains(base, []byte(imageImports)) {
		t.Fatalf("the image's containerd configuration no longer has %s", imageImports)
	}
	unit, err := os.ReadFile("../image/build/recipe/rootfs/usr/lib/systemd/system/gatehouse-bootstrapper.service")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(unit, []byte("--containerd-hosts-dir "+nodeContainerdHostsDir+" ")) {
		t.Fatalf("the image's bootstrapper does not write hosts files to %s, where a mirror-images VM's containerd reads them", nodeContainerdHostsDir)
	}
	hostsDir := `config_path = "` + nodeContainerdHostsDir + `"`
	dir := t.TempDir()
	// dump is containerd's merged configuration with the drop-ins in
	// dropIns instead of the image's directory, without its imports line.
	dump := func(dropIns string) []string {
		config := filepath.Join(dir, filepath.Base(dropIns)+".toml")
		data := bytes.Replace(base, []byte(imageImports), fmt.Appendf(nil, "imports = [%q]", filepath.Join(dropIns, "*.toml")), 1)
		if err := os.WriteFile(config, data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(t.Context(), containerd, "--config", config, "config", "dump").Output()
		if err != nil {
			t.Fatalf("containerd config dump: %v", err)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "imports =") {
				lines = append(lines, l)
			}
		}
		return lines
	}
	alone := dump(filepath.Join(dir, "none"))
	if !slices.Contains(alone, hostsDir) {
		t.Fatalf("the image's containerd does not read hosts files from %s: %q", nodeContainerdHostsDir, alone)
	}
	const pause, registry = "docker.io/local/pause:3.10.2", "10.88.7.1:5000"
	for _, tc := range []struct {
		name                string
		mirrorImages        bool
		wantLost, wantAdded []string
	}{
		{"registry mirror", false,
			[]string{`sandbox_image = "registry.k8s.io/pause:3.10.2"`, hostsDir},
			[]string{
				`sandbox_image = "` + pause + `"`,
				`config_path = ""`,
				`[plugins."io.containerd.grpc.v1.cri".registry.mirrors."` + registry + `"]`,
				`endpoint = ["http://` + registry + `"]`,
				`[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]`,
				`endpoint = ["http://` + registry + `"]`,
			}},
		// The upstream pause image is the image's own: nothing changes.
		{"mirror images", true, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &NodeSpec{Network: 7, PauseImage: pause, MirrorImages: tc.mirrorImages}
			if spec.Network.RegistryAddress() != registry {
				t.Fatalf("network 7's registry is %s", spec.Network.RegistryAddress())
			}
			dropIn, err := vmContainerdConfig(spec)
			if err != nil {
				t.Fatal(err)
			}
			dropIns := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.MkdirAll(dropIns, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dropIns, "50-provisioned.toml"), dropIn, 0o600); err != nil {
				t.Fatal(err)
			}
			merged := dump(dropIns)
			var lost, added []string
			for _, l := range alone {
				if !slices.Contains(merged, l) {
					lost = append(lost, l)
				}
			}
			for _, l := range merged {
				if !slices.Contains(alone, l) {
					added = append(added, l)
				}
			}
			slices.Sort(lost)
			slices.Sort(tc.wantLost)
			if !slices.Equal(lost, tc.wantLost) {
				t.Errorf("with the drop-in containerd lost the image's settings %q, want only %q", lost, tc.wantLost)
			}
			slices.Sort(added)
			slices.Sort(tc.wantAdded)
			if !slices.Equal(added, tc.wantAdded) {
				t.Errorf("the drop-in added %q, want %q", added, tc.wantAdded)
			}
			if !slices.Contains(merged, "SystemdCgroup = true") {
				t.Error("runc does not use the systemd cgroup driver, the kubelet's")
			}
			if got := slices.Contains(merged, hostsDir); got != tc.mirrorImages {
				t.Errorf("containerd reads hosts files from %s: %t, want %t", nodeContainerdHostsDir, got, tc.mirrorImages)
			}
		})
	}
}
