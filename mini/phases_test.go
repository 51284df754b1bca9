package mini

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// TestPlanNodes: every node is named and placed, the first control plane
// alone is initialised, and the provider of each is --provider but for
// the last --vm-workers workers, which are VMs.
func TestPlanNodes(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{"netns cluster", Options{ControlPlanes: 1, Workers: 2},
			[]string{"cp-0/netns", "worker-1/netns", "worker-2/netns"}},
		{"mixed: the last workers are VMs", Options{ControlPlanes: 3, Workers: 3, VMWorkers: 2},
			[]string{"cp-0/netns", "cp-1/netns", "cp-2/netns", "worker-1/netns", "worker-2/qemu", "worker-3/qemu"}},
		{"every worker a VM", Options{ControlPlanes: 1, Workers: 2, VMWorkers: 2},
			[]string{"cp-0/netns", "worker-1/qemu", "worker-2/qemu"}},
		{"every node a VM", Options{ControlPlanes: 2, Workers: 1, Provider: ProviderQEMU},
			[]string{"cp-0/qemu", "cp-1/qemu", "worker-1/qemu"}},
		{"no workers", Options{ControlPlanes: 1, Provider: ProviderNetNS},
			[]string{"cp-0/netns"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakes()
			tt.opts.Dir, tt.opts.Network = "/mini", 3
			u := &up{opts: tt.opts, providers: fs.providers()}
			plan := u.planNodes(nodeBase{images: &nodeImages{manifest: []byte("m")}})
			all := plan.all()
			if got := names(all); !slices.Equal(got, tt.want) {
				t.Fatalf("nodes %v, want %v", got, tt.want)
			}
			for i, n := range all {
				s := n.spec
				if s.Init != (i == 0) || s.ControlPlane != strings.HasPrefix(s.Name, "cp-") {
					t.Errorf("%s: init %t, control plane %t", s.Name, s.Init, s.ControlPlane)
				}
				if s.IP != Network(3).NodeIP(i) || s.Dir != filepath.Join("/mini/nodes", s.Name) || s.PodCIDR != podCIDR(i) {
					t.Errorf("%s placed at %s, %s, %s", s.Name, s.IP, s.Dir, s.PodCIDR)
				}
			}
		})
	}
}

// TestUpNodeOrder: Up's node phases start the first control plane first
// and initialise it once its bootstrapper listens; nodes that start
// before the join data (netns) start at once, and VM-style nodes only
// after init, with the join endpoints and the CA hash in their spec. Each
// node's record names its provider.
func TestUpNodeOrder(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		early      []string // nodes that may start before init
		afterInit  []string // nodes that must start after it
		providerOf map[string]string
	}{
		{"netns cluster", Options{Workers: 2}, []string{"worker-1", "worker-2"}, nil,
			map[string]string{"cp-0": ProviderNetNS, "worker-1": ProviderNetNS, "worker-2": ProviderNetNS}},
		{"mixed cluster", Options{Workers: 3, VMWorkers: 2}, []string{"worker-1"}, []string{"worker-2", "worker-3"},
			map[string]string{"cp-0": ProviderNetNS, "worker-1": ProviderNetNS, "worker-2": ProviderQEMU, "worker-3": ProviderQEMU}},
		{"every node a VM", Options{Workers: 1, Provider: ProviderQEMU}, nil, []string{"worker-1"},
			map[string]string{"cp-0": ProviderQEMU, "worker-1": ProviderQEMU}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakes()
			u := testUp(t, fs, tt.opts)
			plan, err := nodePhases(t.Context(), u, fs)
			if err != nil {
				t.Fatalf("node phases: %v\nevents: %v", err, fs.ev.all())
			}
			ev := fs.ev.all()
			cp := tt.providerOf["cp-0"]
			if len(ev) < 2 || ev[0] != cp+" create cp-0" || ev[1] != cp+" start cp-0" {
				t.Fatalf("the first control plane is not made and started first: %v", ev)
			}
			initAt := fs.ev.index("init")
			if initAt < 0 {
				t.Fatalf("no init: %v", ev)
			}
			for _, n := range append(slices.Clone(tt.early), tt.afterInit...) {
				p := tt.providerOf[n]
				if fs.ev.index(p+" create "+n) < 0 || fs.ev.index(p+" start "+n) < 0 {
					t.Errorf("%s was not made and started by %s: %v", n, p, ev)
				}
			}
			for _, n := range tt.afterInit {
				if at := fs.ev.index(tt.providerOf[n] + " start " + n); at < initAt {
					t.Errorf("%s started before init: %v", n, ev)
				}
			}
			rec := readRecord(t, u.opts.Dir)
			if len(rec.Nodes) != len(tt.providerOf) {
				t.Fatalf("the record has %d nodes, want %d", len(rec.Nodes), len(tt.providerOf))
			}
			for _, nr := range rec.Nodes {
				if nr.Provider != tt.providerOf[nr.Name] || nr.Dir == "" || nr.AgentPID != 1 {
					t.Errorf("record of %s: %+v, want provider %s, its directory, running", nr.Name, nr, tt.providerOf[nr.Name])
				}
			}
			ca, err := kubeconfigCA(filepath.Join(u.opts.Dir, "gatehouse-admin.conf"))
			if err != nil {
				t.Fatal(err)
			}
			hash, err := kubeadm.DiscoveryTokenCACertHashPEM(ca)
			if err != nil {
				t.Fatal(err)
			}
			if rec.CACertHash != hash || !slices.Equal(rec.JoinEndpoints, []string{"10.88.3.10:9090"}) {
				t.Errorf("the record's join data: %v %s, want %s", rec.JoinEndpoints, rec.CACertHash, hash)
			}
			for _, n := range plan.all() {
				spec, err := ReadNodeSpec(filepath.Join(n.spec.Dir, "node.json"))
				if err != nil {
					t.Fatal(err)
				}
				if spec.CACertHash != hash || len(spec.JoinEndpoints) != 1 {
					t.Errorf("%s's node.json lacks the join data: %v %q", n.spec.Name, spec.JoinEndpoints, spec.CACertHash)
				}
			}
		})
	}
}

// TestUpFailureDownCleans: whichever node call fails, Up's phases return
// the error, the record names every machine that was made (also the one
// whose making failed), and Down deletes each through its provider and
// removes the cluster directory.
func TestUpFailureDownCleans(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		failOn string // "<provider> <call> <node>"
	}{
		{"the first control plane is not made", Options{Workers: 1}, "netns create cp-0"},
		{"the first control plane does not start", Options{Workers: 1}, "netns start cp-0"},
		{"a netns worker is not made", Options{Workers: 2}, "netns create worker-2"},
		{"a VM worker is not made", Options{Workers: 2, VMWorkers: 1}, "qemu create worker-2"},
		{"a VM worker does not start", Options{Workers: 2, VMWorkers: 1}, "qemu start worker-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakes()
			provider, call, _ := strings.Cut(tt.failOn, " ")
			map[string]*fakeProvider{ProviderNetNS: fs.netns, ProviderQEMU: fs.qemu}[provider].failOn = call
			u := testUp(t, fs, tt.opts)
			_, err := nodePhases(t.Context(), u, fs)
			if err == nil || !strings.Contains(err.Error(), "the fake fails to "+call) {
				t.Fatalf("node phases: %v, want the failure of %s", err, tt.failOn)
			}
			made := append(fs.netns.leftovers(), fs.qemu.leftovers()...)
			if len(made) == 0 {
				t.Fatal("nothing was made")
			}
			var out bytes.Buffer
			if err := down(t.Context(), u.opts.Dir, &out, fs.lookup); err != nil {
				t.Fatalf("down: %v\n%s", err, out.String())
			}
			if left := append(fs.netns.leftovers(), fs.qemu.leftovers()...); len(left) > 0 {
				t.Errorf("down left %v of %v (events %v)", left, made, fs.ev.all())
			}
			if pathExists(u.opts.Dir) {
				t.Error("the cluster directory remains")
			}
		})
	}
}

// TestDayTwoDispatch: reboot, stop, start, status, node add and down
// reach each node's machine through the provider its record names.
func TestDayTwoDispatch(t *testing.T) {
	fs := newFakes()
	u := testUp(t, fs, Options{Workers: 2, VMWorkers: 1, NodeImage: t.TempDir()})
	if _, err := nodePhases(t.Context(), u, fs); err != nil {
		t.Fatal(err)
	}
	dir, ctx := u.opts.Dir, t.Context()
	var out bytes.Buffer
	mark := len(fs.ev.all())
	newEvents := func() []string {
		all := fs.ev.all()
		got := slices.Clone(all[mark:])
		mark = len(all)
		return got
	}

	t.Run("reboot", func(t *testing.T) {
		before, err := ReadNodeSpec(filepath.Join(dir, "nodes", "worker-2", "node.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := rebootNode(ctx, dir, "worker-2", true, &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		if got, want := newEvents(), []string{"qemu reset worker-2", "qemu start worker-2"}; !slices.Equal(got, want) {
			t.Errorf("reboot of the VM worker: %v, want %v", got, want)
		}
		after, err := ReadNodeSpec(filepath.Join(dir, "nodes", "worker-2", "node.json"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(before.BootManifest, after.BootManifest) {
			t.Error("a tampered reboot measures the same boot manifest")
		}
		if err := rebootNode(ctx, dir, "worker-1", false, &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		if got, want := newEvents(), []string{"netns reset worker-1", "netns start worker-1"}; !slices.Equal(got, want) {
			t.Errorf("reboot of the netns worker: %v, want %v", got, want)
		}
		err = rebootNode(ctx, dir, "worker-9", false, &out, fs.lookup)
		if err == nil || !strings.Contains(err.Error(), "its nodes are [cp-0 worker-1 worker-2]") {
			t.Errorf("reboot of an unknown node: %v", err)
		}
	})
	t.Run("stop one node", func(t *testing.T) {
		out.Reset()
		if err := stop(ctx, dir, "worker-1", &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		if got, want := newEvents(), []string{"netns stop worker-1"}; !slices.Equal(got, want) {
			t.Errorf("stop of worker-1: %v, want %v", got, want)
		}
		mustContain(t, out.String(), "worker-1 is off", "mini node reboot worker-1")
		if err := stop(ctx, dir, "worker-9", &out, fs.lookup); err == nil || !strings.Contains(err.Error(), `no node "worker-9"`) {
			t.Errorf("stop of an unknown node: %v", err)
		}
		if got := newEvents(); len(got) > 0 {
			t.Errorf("a refused stop did %v", got)
		}
	})
	t.Run("stop and start", func(t *testing.T) {
		if err := stop(ctx, dir, "", &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		if got, want := newEvents(), []string{"qemu stop worker-2", "netns stop worker-1", "netns stop cp-0"}; !slices.Equal(got, want) {
			t.Errorf("stop: %v, want %v (newest first)", got, want)
		}
		for _, nr := range readRecord(t, dir).Nodes {
			if nr.AgentPID != 0 {
				t.Errorf("%s is recorded running after stop", nr.Name)
			}
		}
		out.Reset()
		if err := start(ctx, dir, &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		if got, want := newEvents(), []string{"netns start cp-0", "netns start worker-1", "qemu start worker-2"}; !slices.Equal(got, want) {
			t.Errorf("start: %v, want %v", got, want)
		}
		mustContain(t, out.String(), "gatehouse recover", "--endpoint 10.88.3.10:9000")
		if strings.Contains(out.String(), "10.88.3.11:9000") {
			t.Errorf("start names a worker to recover:\n%s", out.String())
		}
		if strings.Contains(out.String(), "--timeout") {
			t.Errorf("start gives recover a VM's timeout for a namespace control plane:\n%s", out.String())
		}
		err := start(ctx, dir, &out, fs.lookup)
		if err == nil || !strings.Contains(err.Error(), "node cp-0 runs: stop the cluster first") {
			t.Errorf("start of a running cluster: %v", err)
		}
		if got := newEvents(); len(got) > 0 {
			t.Errorf("a refused start did %v", got)
		}
	})
	t.Run("status", func(t *testing.T) {
		fs.netns.mu.Lock()
		fs.netns.running["worker-1"] = false
		fs.netns.mu.Unlock()
		out.Reset()
		if err := status(ctx, dir, &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		mustContain(t, out.String(), "cp-0       netns running: true", "worker-1   netns running: false bootstrap: off", "worker-2   qemu  running: true")
	})
	t.Run("node add", func(t *testing.T) {
		name, err := addWorker(ctx, dir, WorkerOptions{Provider: ProviderQEMU}, &out, fs.lookup)
		if err != nil || name != "worker-3" {
			t.Fatalf("node add: %s, %v", name, err)
		}
		if got, want := newEvents(), []string{"qemu create worker-3", "qemu start worker-3"}; !slices.Equal(got, want) {
			t.Errorf("node add --provider qemu: %v, want %v", got, want)
		}
		rec := readRecord(t, dir)
		if nr := rec.Nodes[len(rec.Nodes)-1]; nr.Name != "worker-3" || nr.Provider != ProviderQEMU {
			t.Errorf("the new worker's record: %+v", nr)
		}
		spec, err := ReadNodeSpec(filepath.Join(dir, "nodes", "worker-3", "node.json"))
		if err != nil {
			t.Fatal(err)
		}
		if spec.IP != "10.88.3.13" || spec.ControlPlane || spec.Init || !slices.Equal(spec.JoinEndpoints, rec.JoinEndpoints) || spec.CACertHash != rec.CACertHash {
			t.Errorf("the new worker's spec: %+v", spec)
		}
		if name, err := addWorker(ctx, dir, WorkerOptions{}, &out, fs.lookup); err != nil || name != "worker-4" {
			t.Fatalf("node add: %s, %v", name, err)
		}
		if got, want := newEvents(), []string{"netns create worker-4", "netns start worker-4"}; !slices.Equal(got, want) {
			t.Errorf("node add: %v, want %v", got, want)
		}
	})
	t.Run("node add with user data", func(t *testing.T) {
		if _, err := exec.LookPath("mkfs.vfat"); err != nil {
			t.Fatalf("mkfs.vfat (make setup-test installs dosfstools): %v", err)
		}
		_, err := addWorker(ctx, dir, WorkerOptions{UserData: []byte("#cloud-config\n")}, &out, fs.lookup)
		if err == nil || !strings.Contains(err.Error(), "add the worker with provider qemu") {
			t.Errorf("user data for a netns worker: %v", err)
		}
		if got := newEvents(); len(got) > 0 {
			t.Errorf("a refused node add did %v", got)
		}
		data := []byte("#cloud-config\nwrite_files: []\n")
		name, err := addWorker(ctx, dir, WorkerOptions{Provider: ProviderQEMU, UserData: data}, &out, fs.lookup)
		if err != nil || name != "worker-5" {
			t.Fatalf("node add with user data: %s, %v", name, err)
		}
		if got, want := newEvents(), []string{"qemu create worker-5", "qemu start worker-5"}; !slices.Equal(got, want) {
			t.Errorf("node add with user data: %v, want %v", got, want)
		}
		spec, err := ReadNodeSpec(filepath.Join(dir, "nodes", "worker-5", "node.json"))
		if err != nil {
			t.Fatal(err)
		}
		// Where to join and whom to trust are the data's alone.
		if len(spec.JoinEndpoints) > 0 || spec.CACertHash != "" || spec.SeedDisk == "" {
			t.Errorf("the user-data worker's spec: join endpoints %v, CA hash %q, seed %q", spec.JoinEndpoints, spec.CACertHash, spec.SeedDisk)
		}
		got, err := exec.CommandContext(ctx, "mtype", "-i", spec.SeedDisk, "::user-data").Output()
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("the seed's user-data: %q, %v; want %q", got, err, data)
		}
	})
	t.Run("down", func(t *testing.T) {
		if err := down(ctx, dir, &out, fs.lookup); err != nil {
			t.Fatal(err)
		}
		got := newEvents()
		want := []string{"qemu delete worker-5", "netns delete worker-4", "qemu delete worker-3", "qemu delete worker-2", "netns delete worker-1", "netns delete cp-0"}
		if !slices.Equal(got, want) {
			t.Errorf("down: %v, want %v", got, want)
		}
	})
}

// TestAddWorkerRefusals: a qemu worker needs a node image, and a cluster
// whose record has no join data cannot take one.
func TestAddWorkerRefusals(t *testing.T) {
	fs := newFakes()
	u := testUp(t, fs, Options{Workers: 1})
	if _, err := nodePhases(t.Context(), u, fs); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err := addWorker(t.Context(), u.opts.Dir, WorkerOptions{Provider: ProviderQEMU}, &out, fs.lookup)
	if err == nil || !strings.Contains(err.Error(), "make image") || !strings.Contains(err.Error(), "hack/node-image.sh") {
		t.Errorf("a qemu worker without a node image: %v", err)
	}
	_, err = addWorker(t.Context(), u.opts.Dir, WorkerOptions{Provider: "docker"}, &out, fs.lookup)
	if err == nil || !strings.Contains(err.Error(), `unknown node provider "docker"`) {
		t.Errorf("an unknown provider: %v", err)
	}
	rec := readRecord(t, u.opts.Dir)
	rec.JoinEndpoints = nil
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	_, err = addWorker(t.Context(), u.opts.Dir, WorkerOptions{}, &out, fs.lookup)
	if err == nil || !strings.Contains(err.Error(), "names no join service") {
		t.Errorf("a cluster without join data: %v", err)
	}
	if _, err := addWorker(t.Context(), filepath.Join(t.TempDir(), "none"), WorkerOptions{}, &out, fs.lookup); err == nil || !strings.Contains(err.Error(), "no local cluster in") {
		t.Errorf("no cluster: %v", err)
	}
}

// TestPreflightProviders: a choice of providers is refused before anything
// is made when it cannot work, naming what to do.
func TestPreflightProviders(t *testing.T) {
	image := t.TempDir()
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{"more VM workers than workers", Options{Workers: 2, VMWorkers: 3}, []string{"--vm-workers 3", "--workers (2)"}},
		{"negative VM workers", Options{Workers: 2, VMWorkers: -1}, []string{"--vm-workers -1"}},
		{"qemu without a node image", Options{Workers: 1, Provider: ProviderQEMU}, []string{"make image", "hack/node-image.sh", "--node-image"}},
		{"VM workers without a node image", Options{Workers: 1, VMWorkers: 1}, []string{"make image", "hack/node-image.sh"}},
		{"a node image that is not there", Options{Workers: 1, VMWorkers: 1, NodeImage: filepath.Join(image, "missing")}, []string{"the node image", "missing", "make image"}},
		{"an unknown provider", Options{Workers: 1, Provider: "docker"}, []string{`unknown node provider "docker"`, "netns", "qemu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.ControlPlanes, tt.opts.Network, tt.opts.Dir = 1, 3, t.TempDir()
			u := &up{opts: tt.opts}
			err := u.preflight()
			if err == nil {
				t.Fatal("accepted")
			}
			mustContain(t, err.Error(), tt.want...)
		})
	}
	u := &up{opts: Options{ControlPlanes: 1, Workers: 2, Network: 3, Dir: t.TempDir()}}
	if err := u.makeProviders(); err != nil {
		t.Fatal(err)
	}
	if p, ok := u.providers[ProviderNetNS].(*netnsProvider); !ok || len(u.providers) != 1 || p.gatehouse != "gatehouse" {
		t.Errorf("the default providers: %v", u.providers)
	}
}

// TestWaitListening: the wait for the init port ends when it accepts a
// connection, and fails at once when the node's bootstrapper ended or its
// machine stopped, naming where to look.
func TestWaitListening(t *testing.T) {
	tests := []struct {
		name    string
		listens bool
		status  string // bootstrap.status
		running bool
		want    string // in the error; "": none
	}{
		{"listens", true, "", true, ""},
		{"the bootstrapper ended", false, "failed: no TPM\n", true, "its bootstrapper ended: failed: no TPM"},
		{"the machine stopped", false, "", false, "its machine stopped; see"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakes()
			s := &NodeSpec{Name: "cp-0", IP: "10.88.3.10", Dir: t.TempDir()}
			if tt.status != "" {
				if err := os.WriteFile(filepath.Join(s.Dir, bootstrapStatusFile), []byte(tt.status), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			fs.netns.running["cp-0"] = tt.running
			var dialed []string
			dial := func(_ context.Context, network, addr string) (net.Conn, error) {
				dialed = append(dialed, network+" "+addr)
				if tt.listens {
					c, p := net.Pipe()
					_ = p.Close()
					return c, nil
				}
				return nil, errors.New("connection refused")
			}
			err := waitListening(t.Context(), dial, fs.netns, &NodeRecord{Name: "cp-0", Dir: s.Dir}, s)
			switch {
			case tt.want == "" && err != nil:
				t.Fatal(err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("%v, want %q", err, tt.want)
			}
			if len(dialed) != 1 || dialed[0] != "tcp 10.88.3.10:9000" {
				t.Errorf("dialed %v, want the init port once", dialed)
			}
		})
	}
}

// TestNewProvider: providers are chosen by name; an unknown one is
// refused naming the known ones.
func TestNewProvider(t *testing.T) {
	for _, name := range []string{"", ProviderNetNS} {
		p, err := newProvider(name, providerConfig{Network: 3, Gatehouse: "/bin/gatehouse"})
		if err != nil || p.Name() != ProviderNetNS || !p.StartsBeforeJoinData() {
			t.Errorf("newProvider(%q) = %v, %v", name, p, err)
		}
	}
	_, err := newProvider("docker", providerConfig{})
	if err == nil || err.Error() != `unknown node provider "docker": the providers are netns and qemu` {
		t.Errorf("unknown provider: %v", err)
	}
	rec := &Record{Network: 3}
	_, err = providerFor(rec, &NodeRecord{Name: "worker-1", Provider: "podman"})
	if err == nil || !strings.HasPrefix(err.Error(), "node worker-1: unknown node provider") {
		t.Errorf("a record naming an unknown provider: %v", err)
	}
}

// TestNetNSProviderState: what the netns provider reports without making
// anything: whether the agent runs, and the node's logs, agent's first.
func TestNetNSProviderState(t *testing.T) {
	p := &netnsProvider{network: 3}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"containerd.log", "agent.log", "kubelet.log"} {
		if err := os.WriteFile(filepath.Join(dir, "logs", f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	nr := &NodeRecord{Name: "worker-1", Dir: dir}
	want := []string{filepath.Join(dir, "logs", "agent.log"), filepath.Join(dir, "logs", "containerd.log"), filepath.Join(dir, "logs", "kubelet.log")}
	if got := p.Logs(nr); !slices.Equal(got, want) {
		t.Errorf("logs %v, want %v", got, want)
	}
	if p.Running(nr) {
		t.Error("a node without an agent runs")
	}
	nr.AgentPID = os.Getpid()
	if !p.Running(nr) {
		t.Error("a node whose agent lives does not run")
	}
	if _, err := p.Exec(t.Context(), &NodeRecord{Name: "worker-1"}, "true"); err == nil || !strings.Contains(err.Error(), "is it off?") {
		t.Errorf("exec on a node that is off: %v", err)
	}
	if _, err := p.Exec(t.Context(), nr); err == nil {
		t.Error("exec of nothing succeeded")
	}
}

// TestKubeconfigCA: the cluster CA comes from the admin kubeconfig; one
// without a CA is an error naming the file.
func TestKubeconfigCA(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.conf")
	want, err := writeTestKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := kubeconfigCA(path); err != nil || !bytes.Equal(got, want) {
		t.Errorf("kubeconfigCA = %q, %v", got, err)
	}
	empty := filepath.Join(t.TempDir(), "empty.conf")
	if err := os.WriteFile(empty, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeconfigCA(empty); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s names no cluster CA", empty)) {
		t.Errorf("a kubeconfig without a CA: %v", err)
	}
}

// TestBootstrapPhase: mini status shows the phase a netns node's
// bootstrapper reports under its root; without one, what it may be doing.
func TestBootstrapPhase(t *testing.T) {
	dir := t.TempDir()
	if got := bootstrapPhase(dir); got != "joining, rejoining or waiting to be recovered" {
		t.Errorf("without a status: %q", got)
	}
	file := filepath.Join(dir, "root", "run", "gatehouse", "bootstrapper.json")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(`{"phase":"rejoining","time":"2026-11-28T12:00:00Z"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := bootstrapPhase(dir); got != "rejoining through a join service, or waiting to be recovered" {
		t.Errorf("phase %q, want rejoining (or waiting to be recovered)", got)
	}
}

// TestCheckKubeVersions: a Kubernetes build that is not the cluster's
// version, and an upgrade build that is not the next one, are refused
// before anything is made, naming what to pass.
func TestCheckKubeVersions(t *testing.T) {
	build := func(version string) string {
		dir := t.TempDir()
		script := "#!/bin/sh\necho " + version + "\n"
		if err := os.WriteFile(filepath.Join(dir, "kubeadm"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	v135, v136, v134 := build("v1.35.8"), build("v1.36.4"), build("v1.34.11")
	tests := []struct {
		name     string
		version  string
		kubeBin  string
		upgrades []string
		want     string
	}{
		{"the cluster's build", "v1.35.8", v135, []string{v136}, ""},
		{"a build of another version", "v1.36.4", v135, nil, "is v1.35.8, not v1.36.4: pass its directory with --kube-bin"},
		{"the same version as an upgrade", "v1.35.8", v135, []string{v135}, "the cluster's own version"},
		{"an upgrade skipping a minor version", "v1.34.11", v134, []string{v136}, "skips a minor version"},
		{"an upgrade that is older", "v1.36.4", v136, []string{v135}, "cannot be downgraded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkKubeVersions(Options{KubernetesVersion: tt.version, KubeBinDir: tt.kubeBin, UpgradeKubeBinDirs: tt.upgrades})
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("checkKubeVersions = %v, want %q", err, tt.want)
			}
		})
	}
}
