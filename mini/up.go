package mini

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// DefaultDir is where a local cluster keeps its state.
const DefaultDir = "/var/lib/gatehouse-mini"

// Options configure Up.
type Options struct {
	// Dir is the cluster directory (DefaultDir).
	Dir string
	// Network is where the cluster lives on the host (DefaultNetwork): its
	// bridge, addresses and host-wide names. Clusters on different networks
	// run side by side.
	Network Network
	// ControlPlanes is the number of control planes (1, at most
	// MaxControlPlanes). With more than one, an haproxy load balancer is
	// the cluster's controlPlaneEndpoint and control planes 2..N join
	// through the join service with kubeadm join --control-plane.
	ControlPlanes int
	// Workers is the number of worker nodes (2, at most MaxWorkers).
	Workers int
	// KubeletCertLifetime is the cluster's kubeletCertificateLifetime
	// (0: its default, 24 h). Kubelets renew at 70-90 % of it through CSRs
	// the join service approves after fresh evidence.
	KubeletCertLifetime time.Duration
	// BinDir holds gatehouse, gatehouse-bootstrapper, gatehouse-joinservice,
	// gatehouse-keyservice and gatehouse-pause.
	BinDir string
	// KubeBinDir holds the pinned Kubernetes binaries (hack/kube-binaries.sh).
	KubeBinDir string
	// AddonBinDir holds CoreDNS and the registry, built from their pinned
	// modules (hack/addon-binaries.sh).
	AddonBinDir string
	// KubernetesVersion is the version those binaries are.
	KubernetesVersion string
	// ImageCache, when set, is the directory of built image archives,
	// kept by the digests of everything in them (images.Cache): a
	// second Up with the same binaries skips the image build.
	ImageCache string
	// BootManifest, when set, changes what node measures at boot (its boot
	// manifest, given as the cluster's reference value). A node whose
	// manifest differs fails attestation and is not waited for; the CLI's
	// hidden --tamper flag uses this to show a refused node.
	BootManifest func(node string, manifest []byte) []byte
	// Out receives progress.
	Out io.Writer
	// Init initialises the cluster as `gatehouse init` does: it verifies the
	// node at node against the configuration at config and writes the
	// admin kubeconfig, state and master secret files into dir. It prints
	// its progress to out.
	Init func(ctx context.Context, dir, config, node, initSecretFile string, components []*componentsv1.Component, out io.Writer) error
}

// Limits of a local cluster's size: node addresses and pod ranges are
// numbered in one /24 each.
const (
	MaxControlPlanes = 7
	MaxWorkers       = 20
)

// bootManifest is what every untampered node measures besides its
// bootstrapper: the cluster's image archive digest and Kubernetes version.
func bootManifest(version, imagesDigest string) []byte {
	return []byte("gatehouse-mini boot manifest\nkubernetes " + version + "\nimages sha256:" + imagesDigest + "\n")
}

// Up creates the local cluster: opts.ControlPlanes control planes and
// opts.Workers workers.
// It runs the phases below in order and stops at the first failure,
// saying where the node logs are (`gatehouse mini down` removes what was
// made; the record in opts.Dir says what that is).
func Up(ctx context.Context, opts Options) (err error) {
	if opts.ControlPlanes == 0 {
		opts.ControlPlanes = 1
	}
	u := &up{opts: opts, p: &progress{out: opts.Out, start: time.Now()}}
	if err := u.preflight(); err != nil {
		return err
	}
	if was, raised, err := raiseSysctl(inotifyInstancesPath, minInotifyInstances); err != nil {
		return err
	} else if raised {
		u.p.detail("Raised fs.inotify.max_user_instances from %d to %d for the nodes' kubelets and containerds (about 11 each)", was, minInotifyInstances)
	}
	if err := u.createRecord(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			u.p.step("Failed: %v. Node logs are under %s/nodes/*/logs; `gatehouse mini down` removes everything.", err, opts.Dir)
		}
	}()
	for _, phase := range []func(context.Context) error{
		u.prepare, // the node images (built or cached) and the manufacturer of the nodes' TPMs
		u.createNetwork,
		u.startRegistry,
		u.startNodes, // every node boots; all but the first wait for the join service's address
		u.initControlPlane,
		u.startJoins,      // the other control planes and the workers learn where to join
		u.installServices, // key service and join service
		u.waitReady,
	} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	u.p.step("The cluster is up.")
	fmt.Fprintf(opts.Out, "\nkubeconfig: %s\n  export KUBECONFIG=%s\n\n", u.rec.Kubeconfig, u.rec.Kubeconfig)
	return u.svc.printNodes(ctx, opts.Out)
}

// up is one `mini up`: what each phase leaves for the next.
type up struct {
	opts Options
	p    *progress
	rec  *Record

	archive, pause string        // the image archive and the pause image's reference
	imagesDigest   string        // the archive's digest
	seed           string        // the cluster's containerd seed; "" without one
	manifest       []byte        // what every node measures besides its bootstrapper
	initSecret     string        // file of the init secret the CLI sends
	hashFile       string        // file of its bcrypt hash, given to the control plane
	cp             *NodeSpec     // the first control plane, which init sets up
	tpmCA          swtpm.LocalCA // issues the nodes' EK certificates; the policy trusts it
	components     []*componentsv1.Component
	config         string // the cluster configuration file
	caHash         string // the cluster CA's discovery hash
	svc            *services
	cpAgent        int           // the first control plane's agent
	joiners        []*NodeSpec   // every node but the first
	joinersStarted chan struct{} // closed once startJoiners is done
	joinersErr     error
}

// createRecord makes the cluster directory and its record, which
// `gatehouse mini down` reads to remove what each phase makes.
func (u *up) createRecord() error {
	if err := os.MkdirAll(u.opts.Dir, 0o700); err != nil {
		return err
	}
	u.rec = &Record{Created: time.Now().UTC(), Dir: u.opts.Dir, Network: u.opts.Network}
	return u.rec.save()
}

// prepare builds the node images (or takes them from the cache) and
// creates the nodes' TPM manufacturer CA, at the same time.
func (u *up) prepare(ctx context.Context) error {
	u.p.step("Node images from the pinned binaries (built, or from the cache) and the local TPM manufacturer CA (the nodes' EK certificates chain to it)")
	tpmCA := make(chan error, 1)
	go func() { tpmCA <- u.createTPMCA(ctx) }()
	return errors.Join(u.buildImages(ctx), <-tpmCA)
}

// buildImages writes the image archive every node imports, or links it
// from the cache, and fixes the boot manifest, which names the archive's
// digest.
func (u *up) buildImages(ctx context.Context) error {
	u.archive = filepath.Join(u.opts.Dir, "images.tar")
	specs, pause, err := imageSpecs(ctx, u.opts)
	if err != nil {
		return err
	}
	u.pause = pause
	if u.opts.ImageCache == "" {
		if err := images.WriteArchive(u.archive, "amd64", specs); err != nil {
			return err
		}
		digest, err := images.FileDigest(u.archive)
		if err != nil {
			return err
		}
		u.manifest = bootManifest(u.opts.KubernetesVersion, digest)
		return nil
	}
	cached, err := images.Cache{Dir: u.opts.ImageCache}.Archive("amd64", specs)
	if err != nil {
		return fmt.Errorf("node images (cache %s): %w", u.opts.ImageCache, err)
	}
	how := "built and cached"
	if cached.Hit {
		how = "found in the cache (same binaries)"
	}
	u.p.detail("node images %s: %s", how, cached.Path)
	// The cluster keeps its own link: the cache may drop the archive
	// while nodes still import it at every boot.
	if err := linkOrCopy(cached.Path, u.archive); err != nil {
		return err
	}
	u.imagesDigest = cached.Digest
	u.manifest = bootManifest(u.opts.KubernetesVersion, cached.Digest)
	// The images imported and unpacked once, kept beside the archive, and
	// the cluster's own copy of that, which its nodes start from.
	seed := strings.TrimSuffix(cached.Path, ".tar") + ".containerd"
	var refs []string
	for _, s := range specs {
		refs = append(refs, s.Ref)
	}
	if err := buildSeed(ctx, cached.Path, refs, seed, latestSeed(u.opts.ImageCache, seed)); err != nil {
		u.p.detail("no containerd seed, every node imports the images itself: %v", err)
		return nil
	}
	u.seed = filepath.Join(u.opts.Dir, "images.containerd")
	if err := linkSeed(seed, u.seed); err != nil {
		u.p.detail("no containerd seed, every node imports the images itself: %v", err)
		u.seed = ""
	}
	return nil
}

// linkOrCopy makes dst a hard link to src, or a copy where src is on
// another file system.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.WriteFunc(dst, 0o644, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
}

// createTPMCA creates the local TPM manufacturer's CA, which issues every
// node TPM's EK certificate and which the join policy trusts (ekRoots):
// nodes join with no key registered beforehand.
func (u *up) createTPMCA(ctx context.Context) error {
	u.tpmCA = swtpm.LocalCA{Dir: filepath.Join(u.opts.Dir, "tpm-ca")}
	return u.tpmCA.Init(ctx)
}

// createNetwork creates the cluster bridge, the host's address on it, the
// API servers' load balancer when there is more than one control plane,
// and the init secret files.
func (u *up) createNetwork(ctx context.Context) error {
	nw := u.opts.Network
	u.p.step("Creating the cluster network (bridge %s, %s)", nw.Bridge(), nw.CIDR())
	if err := run(ctx, "ip", "link", "add", nw.Bridge(), "type", "bridge"); err != nil {
		// Another `mini up` on this network took it since the preflight.
		if nerr := networkFree(nw); nerr != nil {
			return nerr
		}
		return err
	}
	u.rec.Bridge = nw.Bridge()
	if err := u.rec.save(); err != nil {
		return err
	}
	// The alias names the cluster, for another mini up's refusal.
	if err := run(ctx, "ip", "link", "set", "dev", nw.Bridge(), "alias", aliasPrefix+u.opts.Dir); err != nil {
		return err
	}
	if err := run(ctx, "ip", "addr", "add", nw.HostIP()+"/24", "dev", nw.Bridge()); err != nil {
		return err
	}
	if err := run(ctx, "ip", "link", "set", nw.Bridge(), "up"); err != nil {
		return err
	}
	if u.opts.ControlPlanes > 1 {
		var backends []string
		for i := range u.opts.ControlPlanes {
			backends = append(backends, nw.NodeIP(i))
		}
		u.p.step("Starting the API servers' load balancer (haproxy) at %s for %d control planes", nw.loadBalancerEndpoint(), len(backends))
		if err := startLoadBalancer(ctx, u.rec, backends); err != nil {
			return err
		}
	}
	var err error
	u.initSecret, u.hashFile, err = initSecretFiles(u.opts.Dir)
	return err
}

// startRegistry starts the local image registry every node pulls from.
func (u *up) startRegistry(ctx context.Context) error {
	u.p.step("Starting the local image registry at %s (gatehouse mini load pushes to it)", u.opts.Network.RegistryAddress())
	return startRegistry(ctx, u.rec, u.opts.AddonBinDir)
}

// newSpec is node i's specification; the hook in Options may change what
// it measures at boot.
func (u *up) newSpec(i int, name string) *NodeSpec {
	manifest := u.manifest
	if u.opts.BootManifest != nil {
		manifest = u.opts.BootManifest(name, bytes.Clone(manifest))
	}
	s := &NodeSpec{
		Network: u.opts.Network, Gateway: u.opts.Network.HostIP(), BinDir: u.opts.BinDir, KubeBinDir: u.opts.KubeBinDir, Images: u.archive, PauseImage: u.pause,
		ImagesDigest: u.imagesDigest, ImagesSeed: u.seed,
		BootManifest: manifest, InitSecretHashFile: u.hashFile, TPMCA: u.tpmCA.Dir,
	}
	s.place(u.opts.Dir, i, name)
	return s
}

// place makes s node i of the cluster in dir on s.Network, named name:
// its address, pod range, directory, namespace and cgroup.
func (s *NodeSpec) place(dir string, i int, name string) {
	s.Name, s.IP, s.PodCIDR = name, s.Network.NodeIP(i), podCIDR(i)
	s.Dir, s.NetNS, s.CgroupRoot = filepath.Join(dir, "nodes", name), s.Network.hostName(name), "/"+s.Network.hostName(name)
}

// podCIDR is node i's pod range; pod ranges are private to a cluster's
// nodes (routed on its bridge only), so every network uses the same.
func podCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// controlPlaneEndpoint is the cluster's controlPlaneEndpoint: the load
// balancer with more than one control plane, else the first one's API
// server.
func (u *up) controlPlaneEndpoint() string {
	if u.opts.ControlPlanes > 1 {
		return u.opts.Network.loadBalancerEndpoint()
	}
	return net.JoinHostPort(u.opts.Network.NodeIP(0), fmt.Sprint(apiServerPort))
}

// startNodes starts every node: the first control plane, which `gatehouse
// init` initialises, and, while it boots and initialises the cluster, the
// nodes that join (the other control planes and the workers; startJoiners
// in the background, which initControlPlane waits for). A joining node
// boots at once (TPM, containerd) and its bootstrapper starts once
// startJoins tells it the join services' endpoints and the cluster CA's
// hash. Their TPMs come from the CA the policy trusts: nothing of theirs
// is registered.
func (u *up) startNodes(ctx context.Context) error {
	u.cp = u.newSpec(0, "cp-0")
	u.cp.ControlPlane, u.cp.Init = true, true
	u.p.step("Starting node %s (%s): network and mount namespaces, containerd, TPM, state disk", u.cp.Name, u.cp.IP)
	if err := u.startNode(ctx, u.cp); err != nil {
		return err
	}
	u.cpAgent = u.rec.node(u.cp.Name).AgentPID
	// Until joinersStarted is closed, only startJoiners uses the record.
	u.joinersStarted = make(chan struct{})
	go func() {
		defer close(u.joinersStarted)
		u.joinersErr = u.startJoiners(ctx)
	}()
	return nil
}

// startJoiners starts every node but the first.
func (u *up) startJoiners(ctx context.Context) error {
	for i := 1; i < u.opts.ControlPlanes+u.opts.Workers; i++ {
		var n *NodeSpec
		if i < u.opts.ControlPlanes {
			n = u.newSpec(i, fmt.Sprintf("cp-%d", i))
			n.ControlPlane = true
		} else {
			n = u.newSpec(i, fmt.Sprintf("worker-%d", i-u.opts.ControlPlanes+1))
		}
		what := "worker"
		if n.ControlPlane {
			what = "control plane, kubeadm join --control-plane"
		}
		u.p.step("Starting node %s (%s; %s): it boots now and joins once the cluster is initialised", n.Name, n.IP, what)
		if err := u.startNode(ctx, n); err != nil {
			return err
		}
		u.joiners = append(u.joiners, n)
	}
	return nil
}

// startNode makes node s's machine and starts it.
func (u *up) startNode(ctx context.Context, s *NodeSpec) error {
	p := &netnsProvider{gatehouse: filepath.Join(u.opts.BinDir, "gatehouse"), network: u.opts.Network}
	if err := createNode(ctx, u.rec, p, s); err != nil {
		return err
	}
	return bootNode(ctx, u.rec, p, s)
}

// waitJoiners waits until startJoiners is done, and returns its error.
func (u *up) waitJoiners() error {
	if u.joinersStarted == nil {
		return nil
	}
	<-u.joinersStarted
	return u.joinersErr
}

// initControlPlane writes the cluster configuration and initialises the
// cluster through the first control plane as `gatehouse init` does
// (Options.Init), as soon as its bootstrapper listens; then it waits for
// the other nodes to have started.
func (u *up) initControlPlane(ctx context.Context) (err error) {
	defer func() {
		// The record is the background's until it is done, also on failure.
		if jerr := u.waitJoiners(); err == nil {
			err = jerr
		}
	}()
	if u.components, err = miniComponents(u.opts.KubernetesVersion, u.opts.KubeBinDir); err != nil {
		return err
	}
	u.config = filepath.Join(u.opts.Dir, "gatehouse-config.yaml")
	endpoint := ""
	if u.opts.ControlPlanes > 1 {
		endpoint = u.opts.Network.loadBalancerEndpoint()
	}
	if err := writeClusterConfig(u.config, u.opts, u.manifest, u.tpmCA, endpoint); err != nil {
		return err
	}
	u.p.step("Waiting for %s to boot (TPM, containerd) and its bootstrapper to listen", u.cp.Name)
	if err := waitListening(ctx, u.cp, u.cpAgent); err != nil {
		return err
	}
	u.p.step("Initialising the cluster on %s (attested init, real kubeadm init)", u.cp.Name)
	out := &timedLines{p: u.p}
	err = u.opts.Init(ctx, u.opts.Dir, u.config, fmt.Sprintf("%s:%d", u.cp.IP, initPort), u.initSecret, u.components, out)
	out.flush()
	if err != nil {
		return err
	}
	if err := u.waitJoiners(); err != nil {
		return err
	}
	u.rec.Kubeconfig = filepath.Join(u.opts.Dir, clusterconfig.DefaultKubeconfig)
	if err := u.rec.save(); err != nil {
		return err
	}
	if u.opts.ControlPlanes > 1 {
		u.p.step("Waiting for the load balancer to route to %s's API server", u.cp.Name)
		return waitLoadBalancer(ctx, u.opts.Network, filepath.Join(u.cp.rootDir(), "etc/kubernetes/pki/ca.crt"))
	}
	return nil
}

// waitListening waits until the bootstrapper of s listens for init (it
// reports the waiting phase once its listener is open), or fails when
// the node's agent or bootstrapper ends first.
func waitListening(ctx context.Context, s *NodeSpec, pid int) error {
	return poll(ctx, 100*time.Millisecond, 3*time.Minute, s.Name+"'s bootstrapper to listen for init", func() (bool, error) {
		if st, err := bootstrapstatus.Read(s.rootDir()); err == nil && st.Phase != "" {
			return true, nil
		}
		if status, err := os.ReadFile(filepath.Join(s.Dir, bootstrapStatusFile)); err == nil {
			return false, fmt.Errorf("its bootstrapper ended: %s (logs in %s)", strings.TrimSpace(string(status)), s.logDir())
		}
		if pid <= 0 || syscall.Kill(pid, 0) != nil {
			return false, fmt.Errorf("its agent exited; see %s", filepath.Join(s.logDir(), "agent.log"))
		}
		return false, nil
	})
}

// timedLines passes the init's progress on, a line at a time, each with
// the time since mini up started.
type timedLines struct {
	p    *progress
	line []byte
}

func (t *timedLines) Write(b []byte) (int, error) {
	for _, c := range b {
		if c == '\n' {
			t.p.detail("%s", t.line)
			t.line = t.line[:0]
			continue
		}
		t.line = append(t.line, c)
	}
	return len(b), nil
}

func (t *timedLines) flush() {
	if len(t.line) > 0 {
		t.p.detail("%s", t.line)
		t.line = nil
	}
}

// startJoins gives every joining node the join services' endpoints (every
// control plane's; one answers while others are not up yet or down) and
// the cluster CA's hash: their bootstrappers start and ask for a join
// ticket until a join service answers. The control planes join one at a
// time, serialised by the join service's Lease, as they ask for their
// tickets.
func (u *up) startJoins(context.Context) error {
	root := u.cp.rootDir()
	ca, err := clusterpki.LoadCA(filepath.Join(root, "etc/kubernetes/pki/ca.crt"), filepath.Join(root, "etc/kubernetes/pki/ca.key"))
	if err != nil {
		return err
	}
	u.caHash = ca.DiscoveryTokenCACertHash()
	var endpoints []string
	for i := range u.opts.ControlPlanes {
		endpoints = append(endpoints, net.JoinHostPort(u.opts.Network.NodeIP(i), fmt.Sprint(joinPort)))
	}
	// What `gatehouse mini node add` needs to make another worker.
	u.rec.JoinEndpoints, u.rec.CACertHash = endpoints, u.caHash
	if err := u.rec.save(); err != nil {
		return err
	}
	if len(u.joiners) > 0 {
		u.p.step("Telling the other nodes where to join (every control plane's join service) and the cluster CA's hash: they join as soon as a join service answers")
	}
	// After a reboot the first control plane, too, rejoins through the
	// join service of another control plane (with one control plane there
	// is none: it waits for gatehouse recover).
	for _, n := range append([]*NodeSpec{u.cp}, u.joiners...) {
		n.JoinEndpoints, n.CACertHash = endpoints, u.caHash
		if err := n.write(); err != nil {
			return err
		}
	}
	return nil
}

// installServices installs the key service and the join service, which
// run on every control plane.
func (u *up) installServices(ctx context.Context) error {
	u.p.step("Installing the key service and the join service (Helm charts, local images; one of each on every control plane)")
	var err error
	u.svc, err = deployServices(ctx, u.opts, u.cp, u.rec.Kubeconfig, u.config, u.controlPlaneEndpoint(), u.components, u.caHash)
	return err
}

// waitReady waits for every node that measures the cluster's reference
// boot manifest to be Ready; one that measures something else fails
// attestation, as it should, and is not waited for.
func (u *up) waitReady(ctx context.Context) error {
	u.p.step("Waiting for the nodes to join through the join service and every node to be Ready")
	var expected []*NodeSpec
	for _, n := range u.joiners {
		if bytes.Equal(n.BootManifest, u.manifest) {
			expected = append(expected, n)
		}
	}
	if err := u.svc.waitReady(ctx, expected, u.p); err != nil {
		return err
	}
	u.p.step("Waiting for kube-proxy on every node and CoreDNS (Services and cluster DNS)")
	return u.svc.waitAddons(ctx, len(expected)+1)
}

// progress prints numbered steps with the time since the start. Steps
// may run at the same time: it is safe for concurrent use.
type progress struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
	n     int
}

func (p *progress) step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	fmt.Fprintf(p.out, "[%5.1fs] %d. %s\n", time.Since(p.start).Seconds(), p.n, fmt.Sprintf(format, args...))
}

// detail prints a line about the current step with the time since the
// start.
func (p *progress) detail(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "[%5.1fs]   %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// imageSpecs are the specifications of every image kubeadm init needs,
// its add-ons (kube-proxy, with Debian's iptables; CoreDNS) included, and
// of the project's services; pause is the pause image's reference.
func imageSpecs(ctx context.Context, opts Options) (specs []images.Spec, pause string, err error) {
	out, err := exec.CommandContext(ctx, filepath.Join(opts.KubeBinDir, "kubeadm"), "config", "images", "list",
		"--kubernetes-version", opts.KubernetesVersion, "--image-repository", ImageRepository).Output()
	if err != nil {
		return nil, "", fmt.Errorf("listing kubeadm's images: %w", err)
	}
	kube := filepath.Join(opts.KubeBinDir, "kube")
	for _, ref := range strings.Fields(string(out)) {
		name := strings.TrimPrefix(ref[:strings.LastIndex(ref, ":")], ImageRepository+"/")
		switch name {
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"kube": kube}, Links: map[string]string{name: "kube"}})
		case "etcd":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"etcd": filepath.Join(opts.KubeBinDir, "etcd")}})
		case "kube-proxy":
			// kube-proxy programs the node's iptables (nf_tables backend)
			// with the iptables commands, which load their extensions at
			// run time.
			files := map[string]string{"kube": kube, "xtables-nft-multi": xtablesMulti}
			links := map[string]string{"kube-proxy": "kube"}
			for _, l := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
				links[l] = "xtables-nft-multi"
			}
			specs = append(specs, images.Spec{Ref: ref, Files: files, Links: links, Dirs: []string{xtablesExtensions}})
		case "coredns":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"coredns": filepath.Join(opts.AddonBinDir, "coredns")},
				Entrypoint: []string{images.BinDir + "/coredns"}})
		case "pause":
			pause = ref
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"pause": filepath.Join(opts.BinDir, "gatehouse-pause")},
				Entrypoint: []string{images.BinDir + "/pause"}})
		}
	}
	if pause == "" {
		return nil, "", fmt.Errorf("kubeadm lists no pause image: %s", out)
	}
	for _, svc := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		specs = append(specs, images.Spec{Ref: ImageRepository + "/" + svc + ":local", Files: map[string]string{svc: filepath.Join(opts.BinDir, svc)}})
	}
	return specs, pause, nil
}

// Debian's iptables (nf_tables backend) and its extensions, which the
// kube-proxy image carries.
const (
	xtablesMulti      = "/usr/sbin/xtables-nft-multi"
	xtablesExtensions = "/usr/lib/x86_64-linux-gnu/xtables"
)

// miniComponents are the versions table's components of the cluster's
// Kubernetes version (names, order, install paths), each pointing through
// a file:// URL with its real sha256 at the local build of that binary:
// the local cluster does not assume access to the official downloads.
// crictl and the CNI plugins have no local build; the nodes use Debian's
// CNI plugins.
func miniComponents(version, kubeBin string) ([]*componentsv1.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, err
	}
	list, err := release.Components("amd64")
	if err != nil {
		return nil, err
	}
	kube := filepath.Join(kubeBin, "kube")
	d, err := images.FileDigest(kube)
	if err != nil {
		return nil, err
	}
	var out []*componentsv1.Component
	for _, c := range list {
		switch c.Name {
		case "kubelet", "kubeadm", "kubectl":
			out = append(out, &componentsv1.Component{Url: "file://" + kube, Hash: "sha256:" + d, InstallPath: c.InstallPath})
		}
	}
	return out, nil
}

// initSecretFiles creates the init secret and its bcrypt hash, which the
// nodes are provisioned with.
func initSecretFiles(dir string) (secretFile, hashFile string, err error) {
	secret := make([]byte, 32)
	if _, err := randRead(secret); err != nil {
		return "", "", err
	}
	text := hex.EncodeToString(secret)
	hash, err := bcrypt.GenerateFromPassword([]byte(text), bcrypt.DefaultCost)
	if err != nil {
		return "", "", err
	}
	secretFile, hashFile = filepath.Join(dir, "init-secret"), filepath.Join(dir, "init-secret.bcrypt")
	if err := os.WriteFile(secretFile, []byte(text), 0o600); err != nil {
		return "", "", err
	}
	return secretFile, hashFile, os.WriteFile(hashFile, hash, 0o600)
}
