package mini

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// DefaultDir is where a local cluster keeps its state.
const DefaultDir = "/var/lib/gatehouse-mini"

// Options configure Up.
type Options struct {
	// Dir is the cluster directory (DefaultDir).
	Dir string
	// Workers is the number of worker nodes (2).
	Workers int
	// BinDir holds gatehouse, gatehouse-bootstrapper, gatehouse-joinservice,
	// gatehouse-keyservice and gatehouse-pause.
	BinDir string
	// KubeBinDir holds the pinned Kubernetes binaries (hack/kube-binaries.sh).
	KubeBinDir string
	// KubernetesVersion is the version those binaries are.
	KubernetesVersion string
	// Tampered names workers that measure a changed boot manifest (tests).
	Tampered []string
	// Out receives progress.
	Out io.Writer
	// Init initialises the cluster as `gatehouse init` does: it verifies the
	// node at node against the configuration at config and writes the
	// admin kubeconfig, state and master secret files into dir.
	Init func(ctx context.Context, dir, config, node, initSecretFile string, components []*componentsv1.Component) error
}

// network of the cluster bridge: the host is .1, node i is .10+i.
const (
	bridgeName = "ghmini0"
	subnet     = "10.88.0"
)

// bootManifest is what every untampered node measures besides its
// bootstrapper: the cluster's image archive digest and Kubernetes version.
func bootManifest(version, imagesDigest string) []byte {
	return []byte("gatehouse-mini boot manifest\nkubernetes " + version + "\nimages sha256:" + imagesDigest + "\n")
}

// Up creates the local cluster: one control plane and opts.Workers workers.
func Up(ctx context.Context, opts Options) (err error) {
	p := &progress{out: opts.Out, start: time.Now()}
	if running, err := exists(opts.Dir); err != nil {
		return err
	} else if running {
		return fmt.Errorf("a local cluster already runs from %s; run `gatehouse mini down` first", opts.Dir)
	}
	if _, err := net.InterfaceByName(bridgeName); err == nil {
		return fmt.Errorf("a local cluster already runs (its bridge %s exists), from another directory; run `gatehouse mini down --dir <its directory>` first", bridgeName)
	}
	if err := CheckPrerequisites(); err != nil {
		return fmt.Errorf("this machine lacks what a local cluster needs:\n%w", err)
	}
	if err := checkBinaries(opts); err != nil {
		return err
	}

	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return err
	}
	rec := &Record{Created: time.Now().UTC(), Dir: opts.Dir}
	if err := rec.save(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			p.step("Failed: %v. Node logs are under %s/nodes/*/logs; `gatehouse mini down` removes everything.", err, opts.Dir)
		}
	}()

	p.step("Building the node images from the pinned binaries")
	archive := filepath.Join(opts.Dir, "images.tar")
	pause, err := buildImages(ctx, opts, archive)
	if err != nil {
		return err
	}
	imagesDigest, err := fileDigest(archive)
	if err != nil {
		return err
	}

	p.step("Creating the cluster network (bridge %s, %s.0/24)", bridgeName, subnet)
	if err := run(ctx, "ip", "link", "add", bridgeName, "type", "bridge"); err != nil {
		return err
	}
	rec.Bridge = bridgeName
	if err := rec.save(); err != nil {
		return err
	}
	if err := run(ctx, "ip", "addr", "add", subnet+".1/24", "dev", bridgeName); err != nil {
		return err
	}
	if err := run(ctx, "ip", "link", "set", bridgeName, "up"); err != nil {
		return err
	}

	initSecret, hashFile, err := initSecretFiles(opts.Dir)
	if err != nil {
		return err
	}
	manifest := bootManifest(opts.KubernetesVersion, imagesDigest)
	newSpec := func(i int, name string) *NodeSpec {
		return &NodeSpec{
			Name: name, IP: fmt.Sprintf("%s.%d", subnet, 10+i), Gateway: subnet + ".1",
			Dir: filepath.Join(opts.Dir, "nodes", name), NetNS: "gh-" + name,
			BinDir: opts.BinDir, KubeBinDir: opts.KubeBinDir, Images: archive, PauseImage: pause,
			PodCIDR: fmt.Sprintf("10.244.%d.0/24", i), CgroupRoot: "/gh-" + name,
			BootManifest: manifest, InitSecretHashFile: hashFile,
		}
	}

	cp := newSpec(0, "cp-0")
	cp.ControlPlane, cp.Init = true, true
	p.step("Starting node %s (%s): network and mount namespaces, containerd, TPM, state disk", cp.Name, cp.IP)
	if err := startNode(ctx, opts, rec, cp); err != nil {
		return err
	}
	cpAK, err := waitFile(ctx, cp.akFile(), time.Minute)
	if err != nil {
		return fmt.Errorf("node %s: %w (see %s)", cp.Name, err, filepath.Join(cp.logDir(), "agent.log"))
	}

	components, err := miniComponents(opts.KubernetesVersion, opts.KubeBinDir)
	if err != nil {
		return err
	}
	config := filepath.Join(opts.Dir, "gatehouse-config.yaml")
	if err := writeClusterConfig(config, opts, manifest, [][]byte{cpAK}); err != nil {
		return err
	}
	p.step("Initialising the cluster on %s (attested init, real kubeadm init)", cp.Name)
	if err := opts.Init(ctx, opts.Dir, config, fmt.Sprintf("%s:%d", cp.IP, InitPort), initSecret, components); err != nil {
		return err
	}
	rec.Kubeconfig = filepath.Join(opts.Dir, "gatehouse-admin.conf")
	if err := rec.save(); err != nil {
		return err
	}

	p.step("Installing the key service and the join service on %s (Helm charts, local images)", cp.Name)
	svc, err := deployServices(ctx, opts, cp, rec.Kubeconfig, config, components)
	if err != nil {
		return err
	}

	var workers []*NodeSpec
	for i := 1; i <= opts.Workers; i++ {
		w := newSpec(i, fmt.Sprintf("worker-%d", i))
		w.JoinEndpoints = []string{fmt.Sprintf("%s:%d", cp.IP, JoinPort)}
		w.CACertHash = svc.caHash
		for _, t := range opts.Tampered {
			if t == w.Name {
				w.BootManifest = append(bytes.Clone(manifest[:len(manifest)-1]), manifest[len(manifest)-1]^1)
			}
		}
		p.step("Starting node %s (%s)", w.Name, w.IP)
		if err := startNode(ctx, opts, rec, w); err != nil {
			return err
		}
		workers = append(workers, w)
	}
	aks := [][]byte{cpAK}
	for _, w := range workers {
		ak, err := waitFile(ctx, w.akFile(), time.Minute)
		if err != nil {
			return fmt.Errorf("node %s: %w", w.Name, err)
		}
		aks = append(aks, ak)
	}
	p.step("Trusting the workers' attestation keys in the join policy")
	if err := writeClusterConfig(config, opts, manifest, aks); err != nil {
		return err
	}
	if err := svc.publishPolicy(ctx, config, components); err != nil {
		return err
	}

	p.step("Waiting for the workers to join through the join service and every node to be Ready")
	if err := svc.waitReady(ctx, workers, opts.Tampered, p); err != nil {
		return err
	}
	p.step("The cluster is up.")
	fmt.Fprintf(opts.Out, "\nkubeconfig: %s\n  export KUBECONFIG=%s\n\n", rec.Kubeconfig, rec.Kubeconfig)
	return svc.printNodes(ctx, opts.Out)
}

// progress prints numbered steps with the time since the start.
type progress struct {
	out   io.Writer
	start time.Time
	n     int
}

func (p *progress) step(format string, args ...any) {
	p.n++
	fmt.Fprintf(p.out, "[%5.1fs] %d. %s\n", time.Since(p.start).Seconds(), p.n, fmt.Sprintf(format, args...))
}

func checkBinaries(opts Options) error {
	if opts.KubeBinDir == "" {
		return errors.New("the pinned Kubernetes binaries are not found: pass --kube-bin or set GATEHOUSE_KUBE_BIN=$(hack/kube-binaries.sh) (make mini-up does)")
	}
	var errs []error
	for _, b := range []string{"gatehouse", "gatehouse-bootstrapper", "gatehouse-joinservice", "gatehouse-keyservice", "gatehouse-pause"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s missing in %s: run `make build`", b, opts.BinDir))
		}
	}
	for _, b := range []string{"kube", "kubeadm", "etcd"} {
		if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s missing in %s: run hack/kube-binaries.sh (make setup does)", b, opts.KubeBinDir))
		}
	}
	return errors.Join(errs...)
}

// buildImages writes the archive of every image kubeadm init needs (except
// the skipped CoreDNS and kube-proxy addons) and of the project's services,
// and returns the pause image's reference.
func buildImages(ctx context.Context, opts Options, archive string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(opts.KubeBinDir, "kubeadm"), "config", "images", "list",
		"--kubernetes-version", opts.KubernetesVersion, "--image-repository", ImageRepository).Output()
	if err != nil {
		return "", fmt.Errorf("listing kubeadm's images: %w", err)
	}
	kube := filepath.Join(opts.KubeBinDir, "kube")
	var specs []images.Spec
	pause := ""
	for _, ref := range strings.Fields(string(out)) {
		name := strings.TrimPrefix(ref[:strings.LastIndex(ref, ":")], ImageRepository+"/")
		switch name {
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"kube": kube}, Links: map[string]string{name: "kube"}})
		case "etcd":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"etcd": filepath.Join(opts.KubeBinDir, "etcd")}})
		case "pause":
			pause = ref
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"pause": filepath.Join(opts.BinDir, "gatehouse-pause")},
				Entrypoint: []string{images.BinDir + "/pause"}})
		}
	}
	if pause == "" {
		return "", fmt.Errorf("kubeadm lists no pause image: %s", out)
	}
	for _, svc := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		specs = append(specs, images.Spec{Ref: ImageRepository + "/" + svc + ":local", Files: map[string]string{svc: filepath.Join(opts.BinDir, svc)}})
	}
	return pause, images.WriteArchive(archive, "amd64", specs)
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

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
	d, err := fileDigest(kube)
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

// startNode creates the node's network namespace, state disk and cgroup
// root, and starts its agent inside the namespaces.
func startNode(ctx context.Context, opts Options, rec *Record, s *NodeSpec) error {
	nr := rec.node(s.Name)
	nr.Dir = s.Dir
	if err := os.MkdirAll(s.logDir(), 0o750); err != nil {
		return err
	}
	if err := run(ctx, "ip", "netns", "add", s.NetNS); err != nil {
		return err
	}
	nr.NetNS = s.NetNS
	veth := "gh" + strings.ReplaceAll(strings.TrimPrefix(s.Name, "worker-"), "cp-", "c") + "h"
	if err := run(ctx, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", s.NetNS); err != nil {
		return err
	}
	nr.HostVeth = veth
	if err := rec.save(); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "set", veth, "master", bridgeName},
		{"link", "set", veth, "up"},
		{"-n", s.NetNS, "addr", "add", s.IP + "/24", "dev", "eth0"},
		{"-n", s.NetNS, "link", "set", "eth0", "up"},
		{"-n", s.NetNS, "link", "set", "lo", "up"},
		{"-n", s.NetNS, "route", "add", "default", "via", s.Gateway},
	} {
		if err := run(ctx, "ip", args...); err != nil {
			return err
		}
	}
	img := filepath.Join(s.Dir, "state-disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", img).Output()
	if err != nil {
		return fmt.Errorf("attaching the state disk: %w", err)
	}
	s.StateDisk = strings.TrimSpace(string(out))
	nr.LoopDevice = s.StateDisk
	if err := createCgroup(s.CgroupRoot); err != nil {
		return err
	}
	nr.CgroupRoot = s.CgroupRoot
	if err := rec.save(); err != nil {
		return err
	}
	if err := s.write(); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(s.logDir(), "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // no secrets
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command("nsenter", "--net=/run/netns/"+s.NetNS, "--",
		"unshare", "--mount", "--propagation", "private", "--",
		filepath.Join(opts.BinDir, "gatehouse"), "mini", "node-agent", "--spec", filepath.Join(s.Dir, "node.json"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent of %s: %w", s.Name, err)
	}
	nr.AgentPID = cmd.Process.Pid
	go func() { _ = cmd.Wait() }()
	// The agent's mount namespace is unshare's once it has exec'd the agent.
	deadline := time.Now().Add(10 * time.Second)
	host, _ := mountNS(os.Getpid())
	for time.Now().Before(deadline) {
		if ns, err := mountNS(cmd.Process.Pid); err == nil && ns != host {
			nr.AgentMountNS = ns
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return rec.save()
}

// waitFile polls for path and returns its content.
func waitFile(ctx context.Context, path string, timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		if data, err := os.ReadFile(path); err == nil && len(data) > 0 {
			return data, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not appear within %s", path, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
