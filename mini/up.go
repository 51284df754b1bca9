package mini

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Up creates the local cluster: opts.ControlPlanes control planes and
// opts.Workers workers, each a machine of the provider the options choose
// for it (Options.Provider, Options.VMWorkers).
// It runs the phases below in order, each handing what it made to the
// next, and stops at the first failure, saying where the node logs are
// (`gatehouse mini down` removes what was made; the record in opts.Dir
// says what that is).
func Up(ctx context.Context, opts Options) (err error) {
	if opts.ControlPlanes == 0 {
		opts.ControlPlanes = 1
	}
	u := &up{opts: opts, p: &progress{out: opts.Out, start: time.Now()}, dial: (&net.Dialer{Timeout: time.Second}).DialContext}
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
	// The node images (built or cached) and the manufacturer of the nodes' TPMs.
	images, tpmCA, err := u.prepare(ctx)
	if err != nil {
		return err
	}
	secret, err := u.createNetwork(ctx)
	if err != nil {
		return err
	}
	if err := u.startRegistry(ctx); err != nil {
		return err
	}
	if err := u.pushMirrorImages(ctx, images); err != nil {
		return err
	}
	plan := u.planNodes(nodeBase{images: images, tpmCA: tpmCA, hashFile: secret.hashFile})
	// The first control plane boots; the other nodes are made meanwhile,
	// and those that may boot before the cluster exists boot.
	joiners, err := u.startNodes(ctx, plan)
	if err != nil {
		return err
	}
	config, err := u.configure(images.manifest, tpmCA)
	if err != nil {
		_ = joiners.wait() // the record is the background's until then
		return err
	}
	kubeconfig, err := u.initControlPlane(ctx, plan, joiners, config, secret)
	if err != nil {
		return err
	}
	// The joining nodes learn where to join; the rest boot now.
	caHash, err := u.startJoins(ctx, plan, kubeconfig)
	if err != nil {
		return err
	}
	svc, err := u.installServices(ctx, plan, config, kubeconfig, caHash)
	if err != nil {
		return err
	}
	if err := u.waitReady(ctx, svc, plan, images.manifest); err != nil {
		return err
	}
	u.p.step("The cluster is up.")
	fmt.Fprintf(opts.Out, "\nkubeconfig: %s\n  export KUBECONFIG=%s\n\n", kubeconfig, kubeconfig)
	return svc.printNodes(ctx, opts.Out)
}

// up is one `mini up`: its options, its progress, the record of what it
// made so far (saved as it grows), and the providers the options chose.
type up struct {
	opts      Options
	p         *progress
	rec       *Record
	providers map[string]Provider // by name
	// dial connects to a node's bootstrapper (net.Dialer.DialContext).
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// createRecord makes the cluster directory and its record, which
// `gatehouse mini down` reads to remove what each phase makes.
func (u *up) createRecord() error {
	if err := os.MkdirAll(u.opts.Dir, 0o700); err != nil {
		return err
	}
	u.rec = &Record{Created: time.Now().UTC(), Dir: u.opts.Dir, Network: u.opts.Network, NodeImage: u.opts.NodeImage}
	return u.rec.save()
}

// startRegistry starts the local image registry every node pulls from,
// and the mirror's file server every node downloads its components from.
func (u *up) startRegistry(ctx context.Context) error {
	u.p.step("Starting the local image registry at %s (gatehouse mini load pushes to it) and the mirror the nodes download Kubernetes from at %s",
		u.opts.Network.RegistryAddress(), u.opts.Network.mirrorURL())
	if err := startRegistry(ctx, u.rec, u.opts.AddonBinDir); err != nil {
		return err
	}
	return startMirror(ctx, u.rec, filepath.Join(u.opts.BinDir, "gatehouse"))
}

// clusterFiles are the cluster configuration Init is given and the
// components its nodes install.
type clusterFiles struct {
	config     string
	components []*componentsv1.Component
}

// configure writes the cluster configuration: the reference values of an
// untampered node's boot manifest, the TPM manufacturer, the endpoint.
func (u *up) configure(manifest []byte, tpmCA swtpm.LocalCA) (clusterFiles, error) {
	components, err := mirrorComponents(u.opts.Dir, u.opts.Network, u.opts.KubernetesVersion, u.opts.KubeBinDir)
	if err != nil {
		return clusterFiles{}, err
	}
	config := filepath.Join(u.opts.Dir, "gatehouse-config.yaml")
	endpoint := ""
	if u.opts.ControlPlanes > 1 {
		endpoint = u.opts.Network.loadBalancerEndpoint()
	}
	return clusterFiles{config: config, components: components}, writeClusterConfig(config, u.opts, manifest, tpmCA, endpoint)
}

// joinerStart is the making of the joining nodes, which startNodes runs
// in the background while the first control plane boots and is
// initialised. Until done is closed only it uses the record.
type joinerStart struct {
	// first is a copy of the first control plane's record as it started.
	first NodeRecord
	done  chan struct{}
	err   error
}

// wait waits until every joining node is made (and started, if it starts
// before the join data), and returns the error of that.
func (j *joinerStart) wait() error {
	<-j.done
	return j.err
}

// startNodes makes and starts the first control plane, which `gatehouse
// init` initialises, and, in the background, makes the nodes that join
// (the other control planes and the workers). A joining node whose
// provider starts it before the join data boots at once (TPM,
// containerd) and its bootstrapper waits for the join services'
// endpoints and the cluster CA's hash, which startJoins gives it; the
// others boot in startJoins. Their TPMs come from the CA the policy
// trusts: nothing of theirs is registered.
func (u *up) startNodes(ctx context.Context, plan *clusterPlan) (*joinerStart, error) {
	cp := plan.init
	u.p.step("Starting node %s (%s; %s): %s", cp.spec.Name, cp.spec.IP, cp.provider.Name(), machineWords(cp.provider))
	if err := createNode(ctx, u.rec, cp.provider, cp.spec); err != nil {
		return nil, err
	}
	if err := bootNode(ctx, u.rec, cp.provider, cp.spec); err != nil {
		return nil, err
	}
	j := &joinerStart{first: *u.rec.node(cp.spec.Name), done: make(chan struct{})}
	go func() {
		defer close(j.done)
		j.err = u.startJoiners(ctx, plan.joiners)
	}()
	return j, nil
}

// machineWords says what a provider's machine is made of.
func machineWords(p Provider) string {
	if p.Name() == ProviderNetNS {
		return "network and mount namespaces, containerd, TPM, state disk"
	}
	return "a VM of the node image with its own TPM and state disk"
}

// startJoiners makes every joining node, and starts those that start
// before the join data.
func (u *up) startJoiners(ctx context.Context, joiners []*plannedNode) error {
	for _, n := range joiners {
		what := "worker"
		if n.spec.ControlPlane {
			what = "control plane, kubeadm join --control-plane"
		}
		if !n.provider.StartsBeforeJoinData() {
			u.p.step("Making node %s (%s; %s, %s): it boots once the cluster is initialised", n.spec.Name, n.spec.IP, what, n.provider.Name())
			if err := createNode(ctx, u.rec, n.provider, n.spec); err != nil {
				return err
			}
			continue
		}
		u.p.step("Starting node %s (%s; %s): it boots now and joins once the cluster is initialised", n.spec.Name, n.spec.IP, what)
		if err := createNode(ctx, u.rec, n.provider, n.spec); err != nil {
			return err
		}
		if err := bootNode(ctx, u.rec, n.provider, n.spec); err != nil {
			return err
		}
	}
	return nil
}

// initControlPlane initialises the cluster through the first control
// plane as `gatehouse init` does (Options.Init), as soon as its
// bootstrapper listens; then it waits for the other nodes to have been
// made. It returns the admin kubeconfig's path.
func (u *up) initControlPlane(ctx context.Context, plan *clusterPlan, joiners *joinerStart, files clusterFiles, secret initSecret) (kubeconfig string, err error) {
	defer func() {
		// The record is the background's until it is done, also on failure.
		if jerr := joiners.wait(); err == nil {
			err = jerr
		}
	}()
	cp := plan.init
	u.p.step("Waiting for %s to boot (TPM, containerd) and its bootstrapper to listen", cp.spec.Name)
	if err := waitListening(ctx, u.dial, cp.provider, &joiners.first, cp.spec); err != nil {
		return "", err
	}
	u.p.step("Initialising the cluster on %s (attested init, real kubeadm init)", cp.spec.Name)
	out := &timedLines{p: u.p}
	err = u.opts.Init(ctx, u.opts.Dir, files.config, net.JoinHostPort(cp.spec.IP, strconv.Itoa(initPort)), secret.file, files.components, out)
	out.flush()
	if err != nil {
		return "", err
	}
	if err := joiners.wait(); err != nil {
		return "", err
	}
	kubeconfig = filepath.Join(u.opts.Dir, clusterconfig.DefaultKubeconfig)
	u.rec.Kubeconfig = kubeconfig
	if err := u.rec.save(); err != nil {
		return "", err
	}
	if u.opts.ControlPlanes > 1 {
		u.p.step("Waiting for the load balancer to route to %s's API server", cp.spec.Name)
		ca, err := kubeconfigCA(kubeconfig)
		if err != nil {
			return "", err
		}
		return kubeconfig, waitLoadBalancer(ctx, u.opts.Network, ca)
	}
	return kubeconfig, nil
}

// startJoins gives every joining node the join services' endpoints
// (every control plane's) and the cluster CA's hash, read from the admin
// kubeconfig, and boots the nodes that start only once they know them:
// their bootstrappers ask for a join ticket until a join service
// answers. The control planes join one at a time, serialised by the join
// service's Lease, as they ask for their tickets. It returns the CA's
// hash.
func (u *up) startJoins(ctx context.Context, plan *clusterPlan, kubeconfig string) (string, error) {
	caPEM, err := kubeconfigCA(kubeconfig)
	if err != nil {
		return "", err
	}
	caHash, err := kubeadm.DiscoveryTokenCACertHashPEM(caPEM)
	if err != nil {
		return "", fmt.Errorf("the cluster CA in %s: %w", kubeconfig, err)
	}
	endpoints := u.joinEndpoints()
	// What `gatehouse mini node add` needs to make another worker.
	u.rec.JoinEndpoints, u.rec.CACertHash = endpoints, caHash
	if err := u.rec.save(); err != nil {
		return "", err
	}
	if len(plan.joiners) > 0 {
		u.p.step("Telling the other nodes where to join (every control plane's join service) and the cluster CA's hash: they join as soon as a join service answers")
	}
	// After a reboot the first control plane, too, rejoins through the
	// join service of another control plane (with one control plane there
	// is none: it waits for gatehouse recover).
	for _, n := range plan.all() {
		n.spec.JoinEndpoints, n.spec.CACertHash = endpoints, caHash
		if err := n.spec.write(); err != nil {
			return "", err
		}
	}
	for _, n := range plan.joiners {
		if n.provider.StartsBeforeJoinData() {
			continue
		}
		u.p.step("Starting node %s (%s; %s): %s", n.spec.Name, n.spec.IP, n.provider.Name(), machineWords(n.provider))
		if err := bootNode(ctx, u.rec, n.provider, n.spec); err != nil {
			return "", err
		}
	}
	return caHash, nil
}

// installServices installs the key service and the join service, which
// run on every control plane.
func (u *up) installServices(ctx context.Context, plan *clusterPlan, files clusterFiles, kubeconfig, caHash string) (*services, error) {
	u.p.step("Installing the key service and the join service (Helm charts, local images; one of each on every control plane)")
	return deployServices(ctx, u.opts, plan.init.spec, kubeconfig, files.config, u.controlPlaneEndpoint(), files.components, caHash)
}

// waitReady waits for every node that measures the cluster's reference
// boot manifest to be Ready; one that measures something else fails
// attestation, as it should, and is not waited for.
func (u *up) waitReady(ctx context.Context, svc *services, plan *clusterPlan, manifest []byte) error {
	u.p.step("Waiting for the nodes to join through the join service and every node to be Ready")
	var expected []*NodeSpec
	for _, n := range plan.joiners {
		if bytes.Equal(n.spec.BootManifest, manifest) {
			expected = append(expected, n.spec)
		}
	}
	if err := svc.waitReady(ctx, expected, u.p); err != nil {
		return err
	}
	u.p.step("Waiting for kube-proxy on every node and CoreDNS (Services and cluster DNS)")
	return svc.waitAddons(ctx, len(expected)+1)
}
