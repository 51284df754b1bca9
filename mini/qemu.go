package mini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/image/qemu"
	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

var _ Provider = (*qemuNodes)(nil)

// qemuNodes is the qemu provider: it makes a node a virtual machine of the node image
// (docs/image.md) with image/qemu: QEMU's q35 machine with OVMF measuring
// the boot into the VM's own swtpm (EK certificate from the cluster's TPM
// manufacturer CA), a tap device on the cluster bridge at the node's
// address, and a state disk the bootstrapper inside encrypts with dm-crypt.
// The VM runs on after the command that started it ends (detached); what
// a later command needs to reach it is in its directory (vm.json, the QMP
// socket). Its bootstrapper is provisioned through fw_cfg (docs/image.md,
// "Provisioning") and pulls its images from the cluster's registry.
type qemuNodes struct {
	// image is the node image's directory (node-controlplane.raw,
	// node-worker.raw, reference-values.signed.json, signing-key.pub).
	image string
	// accel is QEMU's accelerator (auto: KVM where usable, else TCG).
	accel qemu.Accel
	// log receives the VMs' boot progress; nil discards it.
	log *slog.Logger
}

// qemuProvider returns the qemu provider of the cluster c describes: VMs
// of its node image, KVM where usable and TCG elsewhere.
func qemuProvider(c providerConfig) (Provider, error) {
	return newQEMUProvider(c.NodeImage, qemu.AccelAuto, nil)
}

// newQEMUProvider returns the provider of VM nodes booting the node image
// in imageDir (hack/node-image.sh prints it) with accelerator accel
// (qemu.AccelAuto: KVM where usable, else TCG); log, when not nil,
// receives each VM's boot progress.
func newQEMUProvider(imageDir string, accel qemu.Accel, log *slog.Logger) (*qemuNodes, error) {
	for _, f := range []string{qemuImageDisk(imageDir, true), qemuImageDisk(imageDir, false), filepath.Join(imageDir, imageSignedValues)} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("the node image (hack/node-image.sh builds it): %w", err)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &qemuNodes{image: imageDir, accel: accel, log: log}, nil
}

// qemuImageDisk is the image's disk of a role: the roles' UKIs differ in
// their measured command line (gatehouse.role=).
func qemuImageDisk(imageDir string, controlPlane bool) string {
	if controlPlane {
		return filepath.Join(imageDir, "node-controlplane.raw")
	}
	return filepath.Join(imageDir, "node-worker.raw")
}

// Name implements Provider.
func (*qemuNodes) Name() string { return ProviderQEMU }

// qemuStateDiskSize is a VM node's state disk in bytes (sparse on the
// host): LUKS2's header and an ext4 file system for /etc/kubernetes,
// /etc/gatehouse, /var/lib/kubelet and a control plane's /var/lib/etcd.
const qemuStateDiskSize = 1 << 30

// vmRecord is what a VM node owns on the host besides its directory,
// kept in vm.json there (written before each thing is made, so Delete
// finds it after a crash).
type vmRecord struct {
	// Tap is the VM's tap device on the cluster bridge.
	Tap string `json:"tap"`
	// QEMUPID and TPMPID are the running VM's processes (0: not running).
	QEMUPID int `json:"qemuPID,omitempty"`
	TPMPID  int `json:"tpmPID,omitempty"`
}

func vmDir(nodeDir string) string        { return filepath.Join(nodeDir, "vm") }
func vmRecordPath(nodeDir string) string { return filepath.Join(nodeDir, "vm.json") }

func readVMRecord(nodeDir string) (vmRecord, error) {
	var r vmRecord
	data, err := os.ReadFile(vmRecordPath(nodeDir))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%s: %w", vmRecordPath(nodeDir), err)
	}
	return r, nil
}

func (r vmRecord) save(nodeDir string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(vmRecordPath(nodeDir), append(data, '\n'), 0o600)
}

// Create implements Provider: the node's directory, its state disk (1 GiB,
// sparse, serial gatehouse-state in the VM), its TPM (manufactured with an
// EK certificate from s.TPMCA) and a tap device on the cluster bridge.
func (p *qemuNodes) Create(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	nr.Dir, nr.Provider = s.Dir, ProviderQEMU
	dir := vmDir(s.Dir)
	if err := os.MkdirAll(filepath.Join(dir, "provision"), 0o700); err != nil {
		return err
	}
	state := filepath.Join(dir, "state.raw")
	if _, err := os.Stat(state); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(state, nil, 0o600); err != nil {
			return fmt.Errorf("creating the state disk: %w", err)
		}
		if err := os.Truncate(state, qemuStateDiskSize); err != nil {
			return fmt.Errorf("creating the state disk: %w", err)
		}
	}
	if err := swtpm.Manufacture(ctx, filepath.Join(dir, "tpm"), swtpm.LocalCA{Dir: s.TPMCA}); err != nil {
		return fmt.Errorf("manufacturing the TPM of %s: %w", s.Name, err)
	}
	tap := s.Network.hostVeth(s.Name)
	rec := vmRecord{Tap: tap}
	if err := rec.save(s.Dir); err != nil {
		return err
	}
	nr.HostVeth = tap // the node's link on the bridge, as a namespace node's veth
	if err := run(ctx, "ip", "tuntap", "add", "dev", tap, "mode", "tap"); err != nil {
		return fmt.Errorf("creating the tap device of %s: %w", s.Name, err)
	}
	for _, args := range [][]string{
		{"link", "set", tap, "master", s.Network.Bridge()},
		{"link", "set", tap, "up"},
	} {
		if err := run(ctx, "ip", args...); err != nil {
			return fmt.Errorf("attaching %s to the cluster bridge: %w", tap, err)
		}
	}
	return nil
}

// Start implements Provider: it provisions the VM (fw_cfg entries), makes
// sure the cluster's registry holds the images the node pulls, and boots
// the role's disk of the node image. It returns once QEMU runs; the VM
// boots, attests and joins on its own (Logs: its serial console).
func (p *qemuNodes) Start(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	rec, err := readVMRecord(s.Dir)
	if err != nil {
		return fmt.Errorf("%s was not created by the qemu provider: %w", s.Name, err)
	}
	if rec.QEMUPID > 0 && vmProcessAlive(rec.QEMUPID, s.Dir) {
		return fmt.Errorf("%s runs already (QEMU %d)", s.Name, rec.QEMUPID)
	}
	if !s.MirrorImages {
		// A mirror-images cluster's registry holds the images at the
		// mirror's paths already (mini up).
		if err := pushImages(ctx, s); err != nil {
			return err
		}
	}
	entries, err := provisionVM(s)
	if err != nil {
		return err
	}
	var drives []qemu.Drive
	if s.SeedDisk != "" {
		drives = append(drives, qemu.Drive{File: s.SeedDisk, ReadOnly: true})
	}
	vm, err := qemu.Start(ctx, qemu.Config{
		Image:     qemuImageDisk(p.image, s.ControlPlane),
		Drives:    drives,
		Dir:       vmDir(s.Dir),
		MemoryMiB: VMMemoryMiB,
		Accel:     p.accel,
		TPMCA:     swtpm.LocalCA{Dir: s.TPMCA},
		Tap:       rec.Tap,
		MAC:       qemu.MACFromName(s.NetNS),
		FWCfg:     entries,
		Detach:    true,
		Log:       p.log.With("node", s.Name),
	})
	if err != nil {
		return fmt.Errorf("booting %s: %w", s.Name, err)
	}
	rec.QEMUPID, rec.TPMPID = vm.PIDs()
	if err := rec.save(s.Dir); err != nil {
		return errors.Join(err, vm.Stop(context.WithoutCancel(ctx)))
	}
	return vm.Release(ctx)
}

// provisionVM writes the fw_cfg entries of s (docs/image.md,
// "Provisioning"): its address and host name on the bridge with routes to the other
// nodes' pod ranges, where to join and whom to trust (a joining node
// without user data, whose data says so itself), the
// init secret's hash (the first control plane), its Kubernetes name, a
// containerd drop-in that pulls docker.io's images (the cluster's
// docker.io/local/...) from the cluster's registry and uses its pause
// image (with MirrorImages: that reads the image mirror's hosts files the
// bootstrapper writes, vmContainerdConfig), and its pods' CNI network.
func provisionVM(s *NodeSpec) ([]qemu.FWCfgEntry, error) {
	dir := filepath.Join(vmDir(s.Dir), "provision")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var entries []qemu.FWCfgEntry
	add := func(name string, data []byte) error {
		path := filepath.Join(dir, name)
		if err := atomicfile.Write(path, data, 0o600); err != nil {
			return err
		}
		entries = append(entries, qemu.FWCfgEntry{Name: "opt/gatehouse/" + name, File: path})
		return nil
	}
	var network strings.Builder
	// The host name, as DHCP gives one: the node's Kubernetes name also
	// when its user data (cloud-init) names none. A name server, as DHCP
	// gives one: the host's bridge address. Nothing answers there (the
	// cluster has no route out), but without one the VM's resolver is
	// its own loopback, and CoreDNS on a VM forwards to it: to itself,
	// which its loop plugin detects and exits on.
	fmt.Fprintf(&network, "address=%s/24\ngateway=%s\ndns=%s\nhostname=%s\n", s.IP, s.Gateway, s.Gateway, s.Name)
	// Routes to the pod ranges of the nodes made before this one: the
	// image's provisioning read this entry a byte at a time (each a
	// firmware transfer from the entry's start) until it was fixed to read
	// it once, and an entry for every possible node took minutes under
	// TCG. A node added later is reached through its own routes only.
	for i := range nodeIndex(s) {
		fmt.Fprintf(&network, "route=%s,%s\n", podCIDR(i), s.Network.NodeIP(i))
	}
	args := []string{"--node-name=" + s.Name, "--image-repository=" + ImageRepository}
	if s.ControlPlane {
		// Under TCG emulation the API server takes minutes to start,
		// beyond kubeadm's default wait (4 min), and answers a lease
		// renewal in more than the controller manager's and scheduler's
		// 10 s deadline, on which they exit.
		args = append(args, "--control-plane-wait=20m", "--leader-election-lease=60s")
	}
	containerd, err := vmContainerdConfig(s)
	if err != nil {
		return nil, err
	}
	files := []struct {
		name string
		data []byte
	}{
		{"network", []byte(network.String())},
		{"bootstrapper-args", []byte(strings.Join(args, "\n") + "\n")},
		{"containerd.toml", containerd},
		{"cni.conflist", fmt.Appendf(nil, vmCNIConfig, s.PodCIDR)},
	}
	if len(s.JoinEndpoints) > 0 {
		files = append(files, struct {
			name string
			data []byte
		}{"join-endpoints", []byte(strings.Join(s.JoinEndpoints, "\n") + "\n")}, struct {
			name string
			data []byte
		}{"cluster-ca-hash", []byte(s.CACertHash + "\n")})
	}
	if s.Init {
		hash, err := os.ReadFile(s.InitSecretHashFile)
		if err != nil {
			return nil, fmt.Errorf("the init secret's hash: %w", err)
		}
		files = append(files, struct {
			name string
			data []byte
		}{"init-secret.bcrypt", hash})
	}
	for _, f := range files {
		if err := add(f.name, f.data); err != nil {
			return nil, fmt.Errorf("provisioning %s: %w", s.Name, err)
		}
	}
	return entries, nil
}

// nodeIndex is s's place in its cluster (NodeIP(i) is its address).
func nodeIndex(s *NodeSpec) int {
	var i int
	if _, err := fmt.Sscanf(s.IP, s.Network.prefix()+".%d", &i); err != nil || i < 10 {
		return MaxControlPlanes + MaxWorkers
	}
	return min(i-10, MaxControlPlanes+MaxWorkers)
}

// vmContainerdDropInBase is the VM's containerd drop-in: the cluster's
// pause image (%[1]s) as the sandbox image. containerd 1.6 (the image's)
// replaces a plugin's whole table with an imported file's, so the drop-in
// repeats the rest of the image's CRI settings (image/build/recipe/rootfs/
// etc/containerd/config.toml; TestVMContainerdDropIn checks containerd's
// merged configuration): without them the runc runtime fell back to the
// cgroupfs driver beside the kubelet's systemd driver, and the kubelet
// killed and re-created the control plane's static pods over and over.
const vmContainerdDropInBase = `version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[1]s"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
`

// vmContainerdDropIn is vmContainerdDropInBase with docker.io (where the
// cluster names its images, ImageRepository) mirrored by the cluster's
// registry (%[2]s) over plain HTTP on the bridge. It replaces the image's
// hosts files directory (config_path), which containerd refuses beside
// registry mirrors; such a node is sent no image mirror.
const vmContainerdDropIn = vmContainerdDropInBase + `  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
    endpoint = ["http://%[2]s"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."%[2]s"]
    endpoint = ["http://%[2]s"]
`

// vmContainerdMirrorDropIn is vmContainerdDropInBase for a VM that pulls
// every image from the mirror (MirrorImages): the upstream pause image,
// and the image's own hosts files directory (%[2]s), where the
// bootstrapper writes the image mirror's hosts files.
const vmContainerdMirrorDropIn = vmContainerdDropInBase + `  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "%[2]s"
`

// vmContainerdConfig is s's containerd drop-in.
func vmContainerdConfig(s *NodeSpec) ([]byte, error) {
	if !s.MirrorImages {
		return fmt.Appendf(nil, vmContainerdDropIn, s.PauseImage, s.Network.RegistryAddress()), nil
	}
	pause, err := upstreamName(s.PauseImage)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, vmContainerdMirrorDropIn, pause, nodeContainerdHostsDir), nil
}

// vmCNIConfig is the pods' bridge network of a VM node, as a namespace
// node's (writeCNIConfig).
const vmCNIConfig = `{
  "cniVersion": "1.0.0",
  "name": "gatehouse-mini",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`

// registryImagesFile, in the cluster directory, holds the digest of the
// image archive last pushed to the cluster's registry for VM nodes.
const registryImagesFile = "registry-images"

// pushImages pushes the cluster's image archive (s.Images) into the
// cluster's registry, once per archive: a VM node pulls its images (pause,
// kube-proxy; a control plane's etcd and API server) from there, where a
// namespace node imports them.
func pushImages(ctx context.Context, s *NodeSpec) error {
	cluster := filepath.Dir(filepath.Dir(s.Dir)) // <cluster>/nodes/<name>
	marker := filepath.Join(cluster, registryImagesFile)
	digest := s.ImagesDigest
	if digest == "" {
		d, err := images.FileDigest(s.Images)
		if err != nil {
			return err
		}
		digest = d
	}
	if have, err := os.ReadFile(marker); err == nil && strings.TrimSpace(string(have)) == digest {
		return nil
	}
	if _, err := Load(ctx, cluster, s.Images, io.Discard); err != nil {
		return fmt.Errorf("pushing the cluster's images to its registry for VM nodes: %w", err)
	}
	return os.WriteFile(marker, []byte(digest+"\n"), 0o600)
}

// Stop implements Provider: the VM's power button, then (after 30 s, or at
// once without an ACPI handler in the guest) QEMU quits; what is left of
// QEMU and swtpm is killed. Disks, TPM and directory stay.
func (p *qemuNodes) Stop(ctx context.Context, nr *NodeRecord) error {
	return p.stop(ctx, nr, vmPowerOffGrace)
}

// vmPowerOffGrace is how long Stop waits for the guest to power off.
const vmPowerOffGrace = 30 * time.Second

func (p *qemuNodes) stop(ctx context.Context, nr *NodeRecord, grace time.Duration) error {
	rec, err := readVMRecord(nr.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	if rec.QEMUPID > 0 && vmProcessAlive(rec.QEMUPID, nr.Dir) {
		if grace > 0 {
			if _, err := qemu.PowerOffDir(ctx, vmDir(nr.Dir), grace); err != nil {
				p.log.Warn("Powering the VM off", "node", nr.Name, "error", err)
			}
		}
		errs = append(errs, killVMProcess(ctx, rec.QEMUPID, nr.Dir))
	}
	if rec.TPMPID > 0 && vmProcessAlive(rec.TPMPID, nr.Dir) {
		errs = append(errs, killVMProcess(ctx, rec.TPMPID, nr.Dir))
	}
	rec.QEMUPID, rec.TPMPID = 0, 0
	errs = append(errs, rec.save(nr.Dir))
	return errors.Join(errs...)
}

// Reset implements Provider: QEMU's reset line (QMP system_reset). The
// firmware starts again and measures the new boot, the TPM's PCRs start
// from zero; disks and the TPM's keys stay. A VM that does not run is
// started.
func (p *qemuNodes) Reset(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	rec, err := readVMRecord(s.Dir)
	if err != nil {
		return err
	}
	if rec.QEMUPID <= 0 || !vmProcessAlive(rec.QEMUPID, s.Dir) {
		return p.Start(ctx, s, nr)
	}
	return qemu.ResetDir(ctx, vmDir(s.Dir))
}

// Delete implements Provider: the VM's processes are killed (no power-off:
// the node is going), its tap device and directory removed.
func (p *qemuNodes) Delete(ctx context.Context, nr *NodeRecord) error {
	if nr.Dir == "" {
		return nil
	}
	errs := []error{p.stop(ctx, nr, 0)}
	if rec, err := readVMRecord(nr.Dir); err == nil && rec.Tap != "" {
		if err := run(ctx, "ip", "link", "del", rec.Tap); err != nil && linkExists(rec.Tap) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.RemoveAll(nr.Dir))
	return errors.Join(errs...)
}

// Exec implements Provider: a node image offers no shell, by design.
func (*qemuNodes) Exec(context.Context, *NodeRecord, ...string) ([]byte, error) {
	return nil, ErrNoExec
}

// Logs implements Provider: the VM's serial console (firmware, kernel,
// systemd and the bootstrapper's log) and QEMU's own log.
func (*qemuNodes) Logs(nr *NodeRecord) []string {
	dir := vmDir(nr.Dir)
	return []string{filepath.Join(dir, "console.log"), filepath.Join(dir, "qemu.log"), filepath.Join(dir, "tpm", "swtpm.log")}
}

// Running implements Provider: the VM's QEMU runs.
func (*qemuNodes) Running(nr *NodeRecord) bool {
	rec, err := readVMRecord(nr.Dir)
	return err == nil && rec.QEMUPID > 0 && vmProcessAlive(rec.QEMUPID, nr.Dir)
}

// StartsBeforeJoinData implements Provider: a VM reads its provisioning
// (fw_cfg) once, at boot.
func (*qemuNodes) StartsBeforeJoinData() bool { return false }

// linkExists reports whether a network link of that name exists.
func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// vmProcessAlive reports whether pid runs and is one of the VM in nodeDir
// (its command line names the VM's directory): a PID reused by another
// process after a crash is not the VM's.
func vmProcessAlive(pid int, nodeDir string) bool {
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	return strings.Contains(string(cmdline), vmDir(nodeDir))
}

// killVMProcess kills pid (and its process group: QEMU and swtpm lead
// their own sessions) and waits up to 10 s for it to be gone.
func killVMProcess(ctx context.Context, pid int, nodeDir string) error {
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing process %d of the VM: %w", pid, err)
	}
	return poll(ctx, 20*time.Millisecond, 10*time.Second, fmt.Sprintf("process %d of the VM to end", pid), func() (bool, error) {
		return !vmProcessAlive(pid, nodeDir), nil
	})
}
