package mini

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// privateDirs are bind-mounted from the node's root directory over the
// host's, inside the node's mount namespace, so nodes never share state.
var privateDirs = []string{
	"/etc/kubernetes", "/etc/gatehouse", "/etc/cni/net.d", "/usr/local/bin", "/opt/cni/bin",
	"/var/lib/kubelet", "/var/lib/etcd", "/var/lib/containerd", "/var/lib/cni",
	"/var/log/pods", "/var/log/containers", "/var/log/kubernetes",
	// Node-local data for hostPath volumes.
	"/srv",
	"/run/containerd", "/run/gatehouse",
	// containerd pins pod network namespaces here.
	"/run/netns",
}

// nodeClientCA is the cluster CA as a node sees it: kubeadm writes it on
// init and join, into the node's private /etc/kubernetes.
const nodeClientCA = "/etc/kubernetes/pki/ca.crt"

// Status files the agent writes into the node directory.
const (
	bootstrapStatusFile = "bootstrap.status" // "ok" or "failed: <error>"
	mountpointsFile     = "created-mountpoints"
	// imagesImportedFile holds the digest of the image archive whose
	// images the node's containerd holds (seeded or imported).
	imagesImportedFile = "images.imported"
)

// BootArtefacts are what a node measures at "boot": its bootstrapper binary
// and its boot manifest into PCR 4, and its role into rolePCR as a kernel
// command line "gatehouse.role=<role>" is measured
// (docs/joinservice.md, "Roles from evidence").
func BootArtefacts(bootstrapperBin string, manifest []byte, role policy.Role) ([]tpm.Artefact, error) {
	bin, err := tpm.FileArtefact(4, bootstrapperBin)
	if err != nil {
		return nil, err
	}
	return []tpm.Artefact{
		bin, tpm.BytesArtefact(4, "boot-manifest", manifest),
		tpm.BytesArtefact(rolePCR, "kernel-cmdline", []byte("gatehouse.role="+string(role))),
	}, nil
}

// Role returns the role the node measures at boot.
func (s *NodeSpec) Role() policy.Role {
	if s.ControlPlane {
		return policy.RoleControlPlane
	}
	return policy.RoleWorker
}

// Agent runs one node. It must run inside the node's network namespace and
// a private mount namespace (Up starts it that way). It returns when ctx
// ends, after stopping the node's processes.
func Agent(ctx context.Context, spec *NodeSpec, log *slog.Logger) error {
	if err := os.MkdirAll(spec.logDir(), 0o750); err != nil {
		return err
	}
	if err := mountPrivateDirs(spec); err != nil {
		return fmt.Errorf("private directories: %w", err)
	}
	// The TPM (made on the first boot, then started and the boot
	// measured) and the container runtime with the node's images are
	// independent: they start at the same time. Both are ready before
	// anything that is measured or attested runs.
	procs := &processes{log: log, dir: spec.logDir()}
	defer procs.stopAll()
	type tpmResult struct {
		dev *swtpm.TPM
		err error
	}
	tpmReady := make(chan tpmResult, 1)
	go func() {
		dev, err := startTPM(ctx, spec, log)
		tpmReady <- tpmResult{dev, err}
	}()
	runtimeErr := startRuntime(ctx, spec, procs, log)
	tpm := <-tpmReady
	if tpm.dev != nil {
		defer tpm.dev.Stop()
	}
	if err := errors.Join(tpm.err, runtimeErr); err != nil {
		return err
	}
	// The evidence endpoint answers anyone until kubeadm writes the
	// cluster CA, then only the join service and administrators. The path
	// is as the node sees it: this process and its children run in the
	// node's mount namespace, where the node's own root/etc/kubernetes is
	// bind-mounted over /etc/kubernetes (mountPrivateDirs).
	procs.start(ctx, "evidence", filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), "serve-evidence",
		"--tpm", spec.tpmSocket(), "--pcrs", pcrList(), "--tcg-event-log", "", "--listen", fmt.Sprintf("%s:%d", spec.IP, evidencePort),
		"--client-ca", nodeClientCA)
	// The upgrade agent: administrators only, once the node has joined
	// (docs/upgrades.md).
	procs.start(ctx, "upgrade-agent", filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), "serve-upgrade",
		"--listen", fmt.Sprintf("%s:%d", spec.IP, upgradeagentv1.DefaultPort), "--client-ca", nodeClientCA,
		"--kubelet-service", "pidfile:"+kubeletPIDFile, "--ignore-preflight-errors", ignoredPreflightErrors)
	// A control plane's KMS v2 plugin, which its API server needs to read
	// and write Secrets: served from the KEKs init or join puts on the
	// node's state disk, before and whatever the API server does
	// (docs/keys.md, "Secrets encrypted in etcd").
	if spec.ControlPlane {
		procs.start(ctx, "kms-plugin", filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), "serve-kms")
	}
	// On a first boot kubeadm needs the kubelet while it runs, and the
	// kubelet starts once kubeadm wrote its configuration. After a reboot
	// that configuration is there from the start, but a real node's lives
	// on its locked state disk: the kubelet starts only once the
	// bootstrapper unlocked the node (rejoin or recovery).
	bootstrapped := make(chan struct{})
	if _, err := os.Stat(kubeletConfig); err == nil {
		log.Info("A reboot: the kubelet waits for the bootstrapper to unlock the node")
		go func() {
			select {
			case <-bootstrapped:
				superviseKubelet(ctx, spec, procs, log)
			case <-ctx.Done():
			}
		}()
	} else {
		go superviseKubelet(ctx, spec, procs, log)
	}

	if !spec.Init && len(spec.JoinEndpoints) == 0 {
		// A node of `mini up` boots while the first control plane
		// initialises the cluster; it learns where to join after that.
		log.Info("Waiting for the cluster to be initialised: mini up then names the join services and the cluster CA's hash")
		if err := waitJoinEndpoints(ctx, spec); err != nil {
			return err
		}
	}
	log.Info("Running the bootstrapper")
	status := "ok"
	if err := runBootstrapper(ctx, spec); err != nil {
		status = "failed: " + err.Error()
		log.Error("The bootstrapper failed", "error", err.Error())
	} else {
		close(bootstrapped)
		log.Info("The bootstrapper finished")
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, bootstrapStatusFile), []byte(status+"\n"), 0o644); err != nil { //nolint:gosec // status, not secret
		return err
	}
	<-ctx.Done()
	return nil
}

// startTPM makes the node's TPM on its first boot, starts it and
// measures the boot into it.
func startTPM(ctx context.Context, spec *NodeSpec, log *slog.Logger) (*swtpm.TPM, error) {
	if err := manufactureTPM(ctx, spec, log); err != nil {
		return nil, err
	}
	log.Info("Starting the node's TPM and measuring its boot")
	dev, err := swtpm.Start(ctx, filepath.Dir(spec.tpmSocket()))
	if err != nil {
		return nil, err
	}
	if err := measureBoot(spec, dev); err != nil {
		dev.Stop()
		return nil, err
	}
	return dev, nil
}

// startRuntime sets up the pod network, starts containerd and imports the
// node's images.
func startRuntime(ctx context.Context, spec *NodeSpec, procs *processes, log *slog.Logger) error {
	if err := writeCNIConfig(spec); err != nil {
		return err
	}
	if err := routePods(ctx, spec); err != nil {
		return fmt.Errorf("pod network routes: %w", err)
	}
	log.Info("Starting containerd")
	if err := startContainerd(ctx, spec, procs); err != nil {
		return err
	}
	if spec.MirrorImages {
		log.Info("The node imports no images: it pulls every one from the mirror")
		return nil
	}
	marker := filepath.Join(spec.Dir, imagesImportedFile)
	if have, err := os.ReadFile(marker); err == nil && spec.ImagesDigest != "" && strings.TrimSpace(string(have)) == spec.ImagesDigest {
		log.Info("The node's images are in its containerd (from the cluster's containerd seed, or imported at an earlier boot)")
		return nil
	}
	log.Info("Importing the node's images")
	if out, err := exec.CommandContext(ctx, "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io",
		"images", "import", "--no-unpack", spec.Images).CombinedOutput(); err != nil {
		return fmt.Errorf("importing images: %w: %s", err, out)
	}
	log.Info("Imported the node's images")
	if spec.ImagesDigest != "" {
		return os.WriteFile(marker, []byte(spec.ImagesDigest+"\n"), 0o644) //nolint:gosec // a digest
	}
	return nil
}

// waitJoinEndpoints re-reads the node's node.json until it names the join
// services (mini up writes them, with the cluster CA's hash, once the
// cluster is initialised) and takes them into spec.
func waitJoinEndpoints(ctx context.Context, spec *NodeSpec) error {
	path := filepath.Join(spec.Dir, "node.json")
	for {
		if s, err := ReadNodeSpec(path); err == nil && len(s.JoinEndpoints) > 0 {
			spec.JoinEndpoints, spec.CACertHash = s.JoinEndpoints, s.CACertHash
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func pcrList() string {
	var s []string
	for _, p := range PCRs {
		s = append(s, strconv.Itoa(p))
	}
	return strings.Join(s, ",")
}

// mountPrivateDirs bind-mounts the node's directories and /etc/hosts. A
// mountpoint missing on the host is created and recorded for Down.
func mountPrivateDirs(spec *NodeSpec) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	var created []string
	for _, dir := range privateDirs {
		src := filepath.Join(spec.rootDir(), dir)
		if err := os.MkdirAll(src, 0o755); err != nil { //nolint:gosec // stand-ins for /etc/kubernetes, /usr/local/bin, …: world-readable like them
			return err
		}
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // a host mountpoint such as /etc/kubernetes
				return err
			}
			created = append(created, dir)
		}
		if err := syscall.Mount(src, dir, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s over %s: %w", src, dir, err)
		}
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, mountpointsFile), []byte(strings.Join(created, "\n")), 0o644); err != nil { //nolint:gosec // not secret
		return err
	}
	hosts := filepath.Join(spec.Dir, "hosts")
	content := fmt.Sprintf("127.0.0.1 localhost\n%s %s\n", spec.IP, spec.Name)
	if err := os.WriteFile(hosts, []byte(content), 0o644); err != nil { //nolint:gosec // /etc/hosts is world-readable
		return err
	}
	return syscall.Mount(hosts, "/etc/hosts", "", syscall.MS_BIND, "")
}

func measureBoot(spec *NodeSpec, t *swtpm.TPM) error {
	artefacts, err := BootArtefacts(filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), spec.BootManifest, spec.Role())
	if err != nil {
		return err
	}
	rw, err := t.Open()
	if err != nil {
		return err
	}
	defer rw.Close()
	_, err = tpmattester.MeasureBoot(rw, artefacts)
	return err
}

// manufactureTPM makes the node's TPM on its first boot, as its vendor
// would: EKs with certificates from the cluster's local TPM manufacturer
// CA, which the join policy trusts (ekRoots), so no key of the node needs
// registering. A TPM made before (its state file exists) is kept.
func manufactureTPM(ctx context.Context, spec *NodeSpec, log *slog.Logger) error {
	dir := filepath.Dir(spec.tpmSocket())
	if _, err := os.Stat(filepath.Join(dir, swtpm.StateFile)); err == nil {
		return nil
	}
	log.Info("Manufacturing the node's TPM (EK certificate from the local TPM CA)")
	if err := swtpm.Manufacture(ctx, dir, swtpm.LocalCA{Dir: spec.TPMCA}); err != nil {
		return fmt.Errorf("manufacturing the node's TPM: %w", err)
	}
	return nil
}

// writeCNIConfig gives the node a bridge network for its pods.
func writeCNIConfig(spec *NodeSpec) error {
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "gatehouse-mini",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`, spec.PodCIDR)
	return os.WriteFile("/etc/cni/net.d/10-gatehouse-mini.conflist", []byte(conf), 0o644) //nolint:gosec // CNI reads it
}

// routePods makes the node a router for its pods: IPv4 forwarding on, and
// a route to every other node's pod range through that node's address
// (node i owns 10.244.i.0/24; routes to nodes not made yet are harmless).
// Nodes are neighbours on the cluster bridge, so pod traffic between
// nodes never passes through the host.
func routePods(ctx context.Context, spec *NodeSpec) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil { //nolint:gosec // a sysctl
		return err
	}
	var batch strings.Builder
	for i := range MaxControlPlanes + MaxWorkers {
		if cidr := podCIDR(i); cidr != spec.PodCIDR {
			fmt.Fprintf(&batch, "route replace %s via %s\n", cidr, spec.Network.NodeIP(i))
		}
	}
	cmd := exec.CommandContext(ctx, "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -batch: %w: %s", err, out)
	}
	// Service addresses exist only in kube-proxy's rules, which turn them
	// into a pod's or node's address before routing. A pod's connection to
	// one that has no rule yet (kube-proxy starts with the pods) is
	// refused here at once; it would otherwise leave through the host,
	// where nothing answers, and hang until its timeout (CoreDNS's first
	// connection to the API server's Service waited 30 s for that).
	// Once per network namespace: a rebooted node's is still there.
	rule := []string{"FORWARD", "-d", serviceCIDR, "-m", "comment", "--comment", "gatehouse-mini: Service addresses only through kube-proxy's rules", "-j", "REJECT"}
	if exec.CommandContext(ctx, "iptables", append([]string{"-w", "-C"}, rule...)...).Run() == nil {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "iptables", append([]string{"-w", "-A"}, rule...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("iptables: %w: %s", err, out)
	}
	return nil
}

// serviceCIDR is the local cluster's Service range.
const serviceCIDR = "10.96.0.0/12"

// containerdBaseConfig is containerd 1.6's configuration for a node: its own
// paths, the pause image (%[1]s), Debian's CNI plugins, and
// restrict_oom_score_adj, without
// which runc fails when root lacks CAP_SYS_RESOURCE
// (docs/development.md, "Real kubelets in namespaces").
const containerdBaseConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[1]s"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
`

// containerdConfig is containerdBaseConfig pulling through the local
// registry (%[2]s) as a mirror of every registry.
const containerdConfig = containerdBaseConfig + `  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."%[2]s"]
    endpoint = ["http://%[2]s"]
`

func startContainerd(ctx context.Context, spec *NodeSpec, procs *processes) error {
	cfg := filepath.Join(spec.Dir, "containerd.toml")
	data, err := nodeContainerdConfig(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(cfg, data, 0o644); err != nil { //nolint:gosec // not secret
		return err
	}
	procs.start(ctx, "containerd", "containerd", "--config", cfg)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if out, err := exec.CommandContext(ctx, "ctr", "--address", "/run/containerd/containerd.sock", "version").CombinedOutput(); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("waiting for containerd: %w: %s", ctx.Err(), out)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("containerd did not start within a minute; see its log in the node's logs directory")
}

// kubeletConfig is the kubelet configuration kubeadm writes, and
// kubeletFlagsFile the environment file with the node's kubelet flags
// (--hostname-override, --node-ip, the taints of a worker).
const (
	kubeletConfig    = "/var/lib/kubelet/config.yaml"
	kubeletFlagsFile = "/var/lib/kubelet/kubeadm-flags.env"
)

// superviseKubelet runs the kubelet the way kubeadm's systemd drop-in
// does, once kubeadm has written its configuration and flags, and
// restarts it when it exits (there is no systemd in a node).
func superviseKubelet(ctx context.Context, spec *NodeSpec, procs *processes, log *slog.Logger) {
	for ctx.Err() == nil {
		flags, ok := kubeadmKubeletFlags(kubeletConfig, kubeletFlagsFile)
		if !ok {
			// kubeadm waits for the kubelet as soon as it wrote these.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		args := []string{
			"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
			"--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=" + kubeletConfig,
		}
		args = append(args, flags...)
		bin := kubeletBinary(installedKubelet, spec.hostKubelets()...)
		log.Info("Starting the kubelet", "binary", bin)
		p := procs.start(ctx, "kubelet", bin, args...)
		if p.cmd != nil && p.cmd.Process != nil {
			if err := os.WriteFile(kubeletPIDFile, []byte(strconv.Itoa(p.cmd.Process.Pid)+"\n"), 0o644); err != nil { //nolint:gosec // a process ID
				log.Warn("Writing the kubelet's process ID failed: the upgrade agent cannot restart it", "error", err.Error())
			}
		}
		<-p.done
		if ctx.Err() == nil {
			log.Warn("The kubelet exited; restarting it", "error", fmt.Sprint(p.err))
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}
}

// kubeadmKubeletFlags returns the flags of KUBELET_KUBEADM_ARGS in
// kubeadm's flags file, and whether kubeadm has written both that file
// and the kubelet configuration at config, whole. Until then the kubelet
// must not start: kubeadm join writes the configuration first and the
// flags after it (kubeadm init the other way round), each with a plain
// write, and a kubelet started between the two registers under the
// host's name, without the node's address and taints (seen in the
// end-to-end test: a worker never became Ready). kubeadm writes the
// variable as a Go-quoted string and a line break
// (KUBELET_KUBEADM_ARGS="--flag=value ...\n"), so a line without its
// closing quote and line break is still being written.
func kubeadmKubeletFlags(config, flags string) ([]string, bool) {
	if _, err := os.Stat(config); err != nil {
		return nil, false
	}
	data, err := os.ReadFile(flags)
	if err != nil {
		return nil, false
	}
	for line := range strings.Lines(string(data)) {
		v, ok := strings.CutPrefix(line, "KUBELET_KUBEADM_ARGS=")
		if !ok {
			continue
		}
		v, whole := strings.CutSuffix(v, "\"\n")
		if !whole || !strings.HasPrefix(v, `"`) {
			return nil, false
		}
		return strings.Fields(v[1:]), true
	}
	return nil, false
}

// runBootstrapper runs the real gatehouse-bootstrapper for the node.
// ignoredPreflightErrors are kubeadm's checks a namespace node cannot pass
// (it shares the host's kernel, swap and CPUs), for init, join and
// upgrade alike.
const ignoredPreflightErrors = "SystemVerification,Swap,FileExisting-crictl,FileContent--proc-sys-net-bridge-bridge-nf-call-iptables,FileContent--proc-sys-net-ipv4-ip_forward,NumCPU,Mem,Port-10250"

// kubeletPIDFile is where the agent writes the running kubelet's process
// ID, in the node's private /run/gatehouse: the upgrade agent restarts the
// kubelet through it (bootstrapper.PIDFileKubelet).
const kubeletPIDFile = "/run/gatehouse/kubelet.pid"

func runBootstrapper(ctx context.Context, spec *NodeSpec) error {
	// A node on an (emulated) cloud takes its name, address and join
	// endpoints from the instance metadata.
	args := []string{"--node-name", spec.Name, "--advertise-address", spec.IP}
	if spec.CloudMetadata != "" {
		args = []string{"--cloud", spec.CloudMetadata}
	}
	args = append(args,
		// The host's firmware log is not the swtpm's.
		"--tpm", spec.tpmSocket(), "--pcrs", pcrList(), "--tcg-event-log", "", "--state-disk", spec.StateDisk,
		"--state-disk-mapper-name", spec.Network.stateMapperName(spec.Name), "--state-disk-mount", "/run/gatehouse/state",
		// The nodes share the host's kernel, which may lack device-mapper.
		"--insecure-state-on-root-fs",
		"--init-listen", fmt.Sprintf("%s:%d", spec.IP, initPort), "--init-secret-hash-file", spec.InitSecretHashFile,
		"--cgroup-driver", "cgroupfs", "--cgroup-root", spec.CgroupRoot, "--allow-cgroup-v1", "--allow-swap", "--kubelet-shared-disk",
		"--image-repository", ImageRepository, "--image-pull-policy", "Never",
		"--kube-proxy-masquerade-all", "--kube-proxy-conntrack-max-per-core", "0",
		"--ignore-preflight-errors", ignoredPreflightErrors,
		"--kubelet-service", "none",
	)
	args = append(args, controlPlaneEnvArgs()...)
	args = append(args, mirrorImagesArgs(spec)...)
	if len(spec.JoinEndpoints) > 0 {
		// A local cluster's nodes ask again soon: the join service starts
		// while they wait (the default backoff grows to a minute).
		if spec.CloudMetadata == "" {
			args = append(args, "--join-endpoints", strings.Join(spec.JoinEndpoints, ","))
		}
		args = append(args, "--cluster-ca-hash", spec.CACertHash, "--join-backoff", "250ms", "--join-backoff-max", "1s")
		if spec.ControlPlane {
			args = append(args, "--control-plane")
		}
	}
	log, err := os.OpenFile(filepath.Join(spec.logDir(), "bootstrapper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // logs hold no secrets
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "PATH=/usr/local/bin:"+os.Getenv("PATH"))
	return cmd.Run()
}
