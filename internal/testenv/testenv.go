// Package testenv starts a real Kubernetes control plane for tests: etcd and
// kube-apiserver, and on request kube-controller-manager, all built from the
// pinned Kubernetes sources (hack/kube-binaries.sh), listening on loopback
// with freshly generated PKI.
//
// Every environment lives in its own temporary directory (PKI, etcd data,
// kubeconfigs, one log per process). Stop, registered by New as a test
// cleanup, kills the processes by process group and removes the directory even
// when the test fails or panics; the processes also die with the test binary
// (PR_SET_PDEATHSIG) if it is killed before cleanups run, and directories
// left by such a binary are removed by the next Start.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configures Start.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager, kubeadm and
	// kubectl. Empty means BinDir().
	BinDir string
	// ControllerManager also starts kube-controller-manager.
	ControllerManager bool
	// Controllers lists the kube-controller-manager controllers to run
	// (its --controllers flag). Empty means "bootstrapsigner" and
	// "tokencleaner": the ones that sign the cluster-info ConfigMap for
	// bootstrap tokens and delete expired tokens (kubeadm reference,
	// "Authenticating with Bootstrap Tokens").
	Controllers []string
	// StartTimeout bounds the start of all components. Zero means 2 minutes.
	StartTimeout time.Duration
	// APIServerArgs are further kube-apiserver flags, e.g.
	// --encryption-provider-config=<file>.
	APIServerArgs []string
}

// Env is a running environment.
type Env struct {
	// Dir is the environment's directory: pki/, etcd/, kubeconfigs and logs.
	Dir string
	// BinDir is where the binaries were started from.
	BinDir string
	// Config is a client configuration for a cluster administrator
	// (group system:masters) with certificate authentication.
	Config *rest.Config
	// KubeconfigPath is the same administrator as a kubeconfig file.
	KubeconfigPath string
	// APIServerURL is the API server's address, https://127.0.0.1:<port>.
	APIServerURL string
	// CACertPEM is the cluster CA certificate, PEM.
	CACertPEM []byte
	// CACertPath is the cluster CA certificate file.
	CACertPath string
	// APIServerStartup is the time from starting kube-apiserver until its
	// /readyz answered ok.
	APIServerStartup time.Duration
	// EtcdURL is etcd's client URL (plain http on loopback), for tests that
	// read what the API server stored.
	EtcdURL string

	procs []*process
}

// staleOwnerFile holds the PID of the process that owns an environment directory.
const staleOwnerFile = "owner.pid"

// dirPattern names environment directories in os.TempDir().
const dirPattern = "gatehouse-testenv-*"

// New starts an environment for the test and registers its Stop as a
// cleanup. It fails the test if the environment cannot start. When the test
// has failed, the cleanup first logs the tail of every component's log.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	env, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("starting test environment: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range env.procs {
				t.Logf("%s log tail:\n%s", p.name, p.logTail(4096))
			}
		}
		if err := env.Stop(); err != nil {
			t.Errorf("stopping test environment: %v", err)
		}
	})
	return env
}

// Start starts etcd and kube-apiserver (and kube-controller-manager when
// asked) and returns once the API server is ready. On error nothing is left
// running and the directory is removed.
func Start(ctx context.Context, opts Options) (env *Env, err error) {
	if opts.BinDir == "" {
		if opts.BinDir, err = BinDir(); err != nil {
			return nil, err
		}
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	if len(opts.Controllers) == 0 {
		opts.Controllers = []string{"bootstrapsigner", "tokencleaner"}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	removeStaleDirs()
	dir, err := os.MkdirTemp("", dirPattern)
	if err != nil {
		return nil, fmt.Errorf("creating environment directory: %w", err)
	}
	env = &Env{Dir: dir, BinDir: opts.BinDir}
	defer func() {
		if err != nil {
			err = errors.Join(err, env.Stop())
			env = nil
		}
	}()
	if err := writeFile(filepath.Join(dir, staleOwnerFile), []byte(fmt.Sprint(os.Getpid()))); err != nil {
		return env, err
	}
	if err := env.start(ctx, opts); err != nil {
		return env, err
	}
	return env, nil
}

func (e *Env) start(ctx context.Context, opts Options) error {
	pkiDir := filepath.Join(e.Dir, "pki")
	if err := os.Mkdir(pkiDir, 0o700); err != nil {
		return fmt.Errorf("creating PKI directory: %w", err)
	}
	p, err := newPKI(pkiDir)
	if err != nil {
		return fmt.Errorf("generating PKI: %w", err)
	}
	e.CACertPEM, e.CACertPath = p.caPEM, p.path("ca.crt")

	etcdURL, err := e.startEtcd(ctx)
	if err != nil {
		return err
	}
	e.EtcdURL = etcdURL
	if err := e.startAPIServer(ctx, p, etcdURL, opts.APIServerArgs); err != nil {
		return err
	}
	if opts.ControllerManager {
		if err := e.startControllerManager(ctx, p, opts.Controllers); err != nil {
			return err
		}
	}
	return nil
}

// startWithRetry starts a component on fresh ports, retrying when a port
// reserved by freePorts was taken by someone else in the meantime.
func (e *Env) startWithRetry(ctx context.Context, nPorts int, start func(ports []int) (*process, error)) error {
	const attempts = 3
	for i := 1; ; i++ {
		ports, err := freePorts(nPorts)
		if err != nil {
			return err
		}
		proc, err := start(ports)
		if proc != nil {
			e.procs = append(e.procs, proc)
		}
		if err == nil {
			return nil
		}
		if i == attempts || proc == nil || !strings.Contains(proc.logTail(8192), "address already in use") {
			return err
		}
		proc.stop()
	}
}

func (e *Env) startEtcd(ctx context.Context) (string, error) {
	var clientURL string
	err := e.startWithRetry(ctx, 2, func(ports []int) (*process, error) {
		clientURL = "http://" + hostPort(ports[0])
		peerURL := "http://" + hostPort(ports[1])
		proc, err := startProcess("etcd", e.Dir, filepath.Join(e.BinDir, "etcd"),
			"--name=testenv",
			"--data-dir="+filepath.Join(e.Dir, "etcd"),
			"--listen-client-urls="+clientURL,
			"--advertise-client-urls="+clientURL,
			"--listen-peer-urls="+peerURL,
			"--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=testenv="+peerURL,
			"--unsafe-no-fsync", // test data is thrown away; fsync only costs time
			"--log-level=warn",
		)
		if err != nil {
			return nil, err
		}
		client := &http.Client{Timeout: 2 * time.Second}
		return proc, proc.waitReady(ctx, 50*time.Millisecond, func(ctx context.Context) error {
			return httpOK(ctx, client, clientURL+"/health")
		})
	})
	if err != nil {
		return "", fmt.Errorf("starting etcd: %w", err)
	}
	return clientURL, nil
}

func (e *Env) startAPIServer(ctx context.Context, p *pki, etcdURL string, extraArgs []string) error {
	if _, _, err := p.issue(certSpec{
		name: "apiserver", cn: "kube-apiserver",
		dns:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		ips:    []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		usages: serverUsage,
	}); err != nil {
		return err
	}
	if err := p.writeServiceAccountKeys(); err != nil {
		return err
	}
	adminCert, adminKey, err := p.issue(certSpec{name: "admin", cn: "gatehouse-testenv-admin", orgs: []string{"system:masters"}, usages: clientUsage})
	if err != nil {
		return err
	}
	err = e.startWithRetry(ctx, 1, func(ports []int) (*process, error) {
		e.APIServerURL = "https://" + hostPort(ports[0])
		e.Config = &rest.Config{
			Host:            e.APIServerURL,
			TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: adminCert, KeyData: adminKey},
			QPS:             100,
			Burst:           200,
		}
		started := time.Now()
		proc, err := startProcess("kube-apiserver", e.Dir, filepath.Join(e.BinDir, "kube-apiserver"), append([]string{
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[0]),
			"--etcd-servers=" + etcdURL,
			"--cert-dir=" + p.dir,
			"--tls-cert-file=" + p.path("apiserver.crt"),
			"--tls-private-key-file=" + p.path("apiserver.key"),
			"--client-ca-file=" + p.path("ca.crt"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p.path("sa.pub"),
			"--service-account-signing-key-file=" + p.path("sa.key"),
			"--service-cluster-ip-range=10.96.0.0/12",
			"--authorization-mode=Node,RBAC",
			"--enable-bootstrap-token-auth=true",
			"--allow-privileged=true",
			// The loopback address cannot be an Endpoints address; nothing in the
			// environment needs the in-cluster "kubernetes" Service endpoints.
			"--endpoint-reconciler-type=none",
		}, extraArgs...)...,
		)
		if err != nil {
			return nil, err
		}
		client, err := kubernetes.NewForConfig(e.Config)
		if err != nil {
			return proc, fmt.Errorf("creating client: %w", err)
		}
		err = proc.waitReady(ctx, 100*time.Millisecond, func(ctx context.Context) error {
			_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err
		})
		e.APIServerStartup = time.Since(started)
		return proc, err
	})
	if err != nil {
		return fmt.Errorf("starting kube-apiserver: %w", err)
	}
	e.KubeconfigPath = filepath.Join(e.Dir, "admin.conf")
	return writeKubeconfig(e.KubeconfigPath, e.APIServerURL, p.caPEM, "admin", adminCert, adminKey)
}

func (e *Env) startControllerManager(ctx context.Context, p *pki, controllers []string) error {
	cert, key, err := p.issue(certSpec{name: "controller-manager", cn: "system:kube-controller-manager", usages: clientUsage})
	if err != nil {
		return err
	}
	if _, _, err := p.issue(certSpec{name: "controller-manager-serving", cn: "kube-controller-manager",
		ips: []net.IP{net.IPv4(127, 0, 0, 1)}, usages: serverUsage}); err != nil {
		return err
	}
	kubeconfig := filepath.Join(e.Dir, "controller-manager.conf")
	if err := writeKubeconfig(kubeconfig, e.APIServerURL, p.caPEM, "system:kube-controller-manager", cert, key); err != nil {
		return err
	}
	err = e.startWithRetry(ctx, 1, func(ports []int) (*process, error) {
		proc, err := startProcess("kube-controller-manager", e.Dir, filepath.Join(e.BinDir, "kube-controller-manager"),
			"--kubeconfig="+kubeconfig,

			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[0]),
			"--tls-cert-file="+p.path("controller-manager-serving.crt"),
			"--tls-private-key-file="+p.path("controller-manager-serving.key"),
			"--controllers="+strings.Join(controllers, ","),
			"--leader-elect=false",
			"--cluster-signing-cert-file="+p.path("ca.crt"),
			"--cluster-signing-key-file="+p.path("ca.key"),
			"--root-ca-file="+p.path("ca.crt"),
			"--service-account-private-key-file="+p.path("sa.key"),
			"--use-service-account-credentials=true", // as kubeadm: each controller acts as its own service account
		)
		if err != nil {
			return nil, err
		}
		client, err := httpsClient(p.caPEM)
		if err != nil {
			return proc, err
		}
		url := "https://" + hostPort(ports[0]) + "/healthz"
		return proc, proc.waitReady(ctx, 100*time.Millisecond, func(ctx context.Context) error {
			return httpOK(ctx, client, url)
		})
	})
	if err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	return nil
}

// Stop kills the environment's processes (in reverse start order) and removes
// its directory. It is safe to call more than once.
func (e *Env) Stop() error {
	for i := len(e.procs) - 1; i >= 0; i-- {
		e.procs[i].stop()
	}
	e.procs = nil
	if e.Dir == "" {
		return nil
	}
	if err := os.RemoveAll(e.Dir); err != nil {
		return fmt.Errorf("removing %s: %w", e.Dir, err)
	}
	return nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling restart
// does) and starts it again with the same flags, data and PKI, returning
// once it is ready again.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	return e.StartAPIServer(ctx)
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after the
// grace period) and returns once it is gone; StartAPIServer brings it back.
func (e *Env) StopAPIServer() error {
	p, err := e.apiServer()
	if err != nil {
		return err
	}
	p.stop()
	return nil
}

// StartAPIServer starts a stopped kube-apiserver again with the same flags,
// data and PKI, and returns once its /readyz answers.
func (e *Env) StartAPIServer(ctx context.Context) error {
	for i, p := range e.procs {
		if p.name != "kube-apiserver" {
			continue
		}
		started, err := p.restart() // p is stopped already: this starts it
		if err != nil {
			return fmt.Errorf("starting kube-apiserver again: %w", err)
		}
		e.procs[i] = started
		client, err := e.Clientset()
		if err != nil {
			return err
		}
		return started.waitReady(ctx, 100*time.Millisecond, func(ctx context.Context) error {
			_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err
		})
	}
	return errors.New("starting kube-apiserver: the environment has none")
}

func (e *Env) apiServer() (*process, error) {
	for _, p := range e.procs {
		if p.name == "kube-apiserver" {
			return p, nil
		}
	}
	return nil, errors.New("the environment has no kube-apiserver")
}

// PIDs returns the process IDs of the running components, by name.
func (e *Env) PIDs() map[string]int {
	pids := make(map[string]int, len(e.procs))
	for _, p := range e.procs {
		pids[p.name] = p.pid()
	}
	return pids
}

// Clientset returns a clientset for the administrator.
func (e *Env) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(e.Config)
}

func writeKubeconfig(path, server string, caPEM []byte, user string, certPEM, keyPEM []byte) error {
	cfg := kubeconfig(server, caPEM, user, &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM})
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// Kubeconfig returns cfg as a kubeconfig file's contents: its server, CA,
// and client certificate or bearer token, all inline. It is how a test
// hands a binary it starts, or a Cluster API kubeconfig Secret, the
// credentials of a test API server (NewEnvtest's or Env.Config).
func Kubeconfig(t testing.TB, cfg *rest.Config) []byte {
	t.Helper()
	data, err := clientcmd.Write(*kubeconfig(cfg.Host, cfg.CAData, "admin", &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}))
	if err != nil {
		t.Fatalf("writing a kubeconfig for %s: %v", cfg.Host, err)
	}
	return data
}

// kubeconfig is a kubeconfig with one cluster, user and context.
func kubeconfig(server string, caPEM []byte, user string, auth *clientcmdapi.AuthInfo) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	return cfg
}

// removeStaleDirs removes environment directories whose owning test process
// is gone (it was killed before its cleanups ran).
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPattern))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, staleOwnerFile))
		if err != nil {
			continue // being created, or not ours
		}
		if _, err := os.Stat(filepath.Join("/proc", strings.TrimSpace(string(data)))); errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(dir)
		}
	}
}
