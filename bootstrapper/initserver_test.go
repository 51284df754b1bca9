package bootstrapper

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/tools/clientcmd"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// initFixture is a node serving InitService over attested TLS, and what a
// client (the CLI) knows.
type initFixture struct {
	node       *testNode
	server     *InitServer
	bindings   *nameBindings
	client     initservicev1.InitServiceClient
	secret     []byte
	master     []byte
	masterSalt []byte
	req        *initservicev1.InitRequest
}

func newInitFixture(t *testing.T) *initFixture {
	t.Helper()
	return newInitFixtureHashed(t, true)
}

// newInitFixtureHashed is newInitFixture, with the node provisioned with
// the init secret's hash or (hashed false) with none.
func newInitFixtureHashed(t *testing.T, hashed bool) *initFixture {
	t.Helper()
	n := newTestNode(t)
	n.formatDisk(t)
	f := &initFixture{node: n, secret: random(t, 32), master: random(t, 32), masterSalt: random(t, 32)}
	var hash []byte
	if hashed {
		var err error
		if hash, err = bcrypt.GenerateFromPassword(f.secret, bcrypt.MinCost); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	f.bindings = &nameBindings{}
	f.server, err = NewInitServer(InitServerConfig{Machine: n.machine, Lock: n.lock, Identity: n.identity(t), InitSecretHash: hash, AdminName: "alice", BindName: f.bindings.bind, EncryptSecrets: true})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: n.attester})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	initservicev1.RegisterInitServiceServer(srv, f.server)
	addr := serve(t, srv)
	f.client = initservicev1.NewInitServiceClient(dial(t, addr, atls.Config{Verifiers: []attestation.Verifier{verifier(t, n.attester)}}))
	root := n.machine.Root
	f.req = &initservicev1.InitRequest{
		InitSecret: f.secret,
		KmsUri:     kms.ClusterKMSURIString(f.master, f.masterSalt),
		// The master secret as an external KMS wraps it, which the node
		// stores instead.
		KeyServiceKmsUri: (&kms.AWSKMSURI{KeyID: "alias/gatehouse", Region: "eu-west-1",
			WrappedSecret: kms.WrappedSecret{Wrapped: random(t, 180), Salt: f.masterSalt}}).String(),
		MeasurementSalt:   random(t, 32),
		KubernetesVersion: "v1.36.4",
		KubernetesComponents: []*componentsv1.Component{
			component(t, root, "kubelet", "kubelet v1.36.4"),
			component(t, root, "kubeadm", "kubeadm v1.36.4"),
		},
		ClusterName:          "gatehouse",
		ApiServerCertSans:    []string{"gatehouse.example"},
		ServiceCidr:          "10.96.0.0/12",
		PodCidr:              "10.244.0.0/16",
		ControlPlaneEndpoint: "api.gatehouse.example:6443",
		// Kubelet certificates of an hour: kubeadm keeps the kubelet.conf
		// written with one.
		KubeletCertLifetimeSeconds: 3600,
	}
	return f
}

// expected derives what the node must end up with from the client's view.
func (f *initFixture) expected(t *testing.T) (id, diskKey []byte) {
	t.Helper()
	derive, err := kms.NewClusterKMS(f.master, f.masterSalt)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := derive.GetDataKey(t.Context(), keys.MeasurementSecretID, keys.MeasurementSecretSize)
	if err != nil {
		t.Fatal(err)
	}
	if id, err = keys.DeriveClusterID(secret, f.req.GetMeasurementSalt()); err != nil {
		t.Fatal(err)
	}
	uuid, err := f.node.disk.UUID(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	diskKeyID, err := keys.DiskKeyID(f.node.identity(t), uuid)
	if err != nil {
		t.Fatal(err)
	}
	if diskKey, err = derive.GetDataKey(t.Context(), diskKeyID, keys.StateDiskKeySize); err != nil {
		t.Fatal(err)
	}
	return id, diskKey
}

// receive reads a stream to its end: progress steps and the final message.
func receive(t *testing.T, stream grpc.ServerStreamingClient[initservicev1.InitResponse]) ([]string, *initservicev1.InitResponse, error) {
	t.Helper()
	var steps []string
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return steps, nil, errors.New("stream ended without a final message")
		}
		if err != nil {
			return steps, nil, err
		}
		if p := resp.GetProgress(); p != nil {
			steps = append(steps, p.GetStep())
			continue
		}
		return steps, resp, nil
	}
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestInit: an init with the right secret takes the lock with the cluster
// ID, re-keys the disk to the derived key, installs the components, writes
// the CA and configuration, runs the real kubeadm init (dry run), and
// returns a named admin's kubeconfig and the cluster ID.
func TestInit(t *testing.T) {
	f := newInitFixture(t)
	vol := &recordingVolume{}
	f.node.machine.State = vol
	ctx := t.Context()
	first := f.node.machine.FirstBootKey
	var initConfig string // what kubeadm init was given (removed after it)
	// containerd's hosts.toml for the image mirror, as kubeadm init found it.
	pauseHosts := filepath.Join(f.node.machine.Root, DefaultContainerdHostsDir, "registry.k8s.io", "hosts.toml")
	var hostsAtInit string
	f.node.runner.onRun = func(args []string) {
		if i := slices.Index(args, "--config"); args[0] == "init" && i >= 0 && i+1 < len(args) {
			data, _ := os.ReadFile(args[i+1])
			initConfig = string(data)
			hosts, _ := os.ReadFile(pauseHosts)
			hostsAtInit = string(hosts)
		}
	}
	// The cluster configuration's mirror (docs/install-airgapped.md).
	f.req.ImageRepository = "mirror.example:5000/registry.k8s.io"
	f.req.ImageMirror = &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"registry.k8s.io", "docker.io"}}
	stream, err := f.client.Init(ctx, f.req)
	if err != nil {
		t.Fatal(err)
	}
	steps, final, err := receive(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if failure := final.GetFailure(); failure != nil {
		t.Fatalf("init failed: %s\n%s", failure.GetError(), gunzip(t, failure.GetLogsGzip()))
	}
	want := "node-lock,rekey-state-disk,install-components,image-mirror,pki,kubeadm-config,kubeadm-init,node-binding,admin-kubeconfig"
	if got := strings.Join(steps, ","); got != want {
		t.Fatalf("progress steps %s, want %s", got, want)
	}
	// containerd pulls the pause image (and every registry.k8s.io and
	// docker.io image) from the mirror, configured before kubeadm pulls.
	if !strings.Contains(hostsAtInit, `[host."https://mirror.example:5000/v2/registry.k8s.io"]`) {
		t.Errorf("when kubeadm init ran, %s held %q, want the mirror's host", pauseHosts, hostsAtInit)
	}
	if data, err := os.ReadFile(filepath.Join(f.node.machine.Root, DefaultContainerdHostsDir, "docker.io", "hosts.toml")); err != nil || !strings.Contains(string(data), `[host."https://mirror.example:5000/v2/docker.io"]`) {
		t.Errorf("docker.io's hosts.toml: %v\n%s", err, data)
	}
	wantID, diskKey := f.expected(t)
	if got := f.bindings.of(f.node.machine.Node.Name); got != f.node.identity(t) {
		t.Errorf("init bound node %s to %q, want its identity", f.node.machine.Node.Name, got)
	}
	vol.unlockedWith(t, diskKey)
	if !bytes.Equal(final.GetSuccess().GetClusterId(), wantID) {
		t.Fatal("cluster ID differs from HKDF(measurementSecret, measurementSalt, \"key-clusterID\")")
	}
	pcr, err := tpm2.ReadPCR(f.node.sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(wantID)) {
		t.Fatal("PCR 15 does not hold the cluster ID")
	}
	for key, want := range map[string]bool{"first-boot": false, "derived": true} {
		k := first
		if key == "derived" {
			k = diskKey
		}
		if ok, err := f.node.disk.TestKey(ctx, k); err != nil || ok != want {
			t.Errorf("%s key opens the disk: %v (%v), want %v", key, ok, err, want)
		}
	}
	if st, _ := f.node.disk.State(ctx); st != statedisk.Initialised {
		t.Errorf("disk state %s", st)
	}
	root := f.node.machine.Root
	for path, mode := range map[string]os.FileMode{
		"usr/local/bin/kubelet": 0o755, "etc/kubernetes/pki/ca.key": 0o600, "etc/kubernetes/pki/ca.crt": 0o644,
		strings.TrimPrefix(kms.URIFile, "/"): 0o600, strings.TrimPrefix(kubeadm.AuditPolicyPath, "/"): 0o600,
		strings.TrimPrefix(kubeadm.KubeletKubeconfigPath, "/"): 0o600,
		strings.TrimPrefix(EtcdKEKFile, "/"):                   0o600, strings.TrimPrefix(kubeadm.EncryptionConfigPath, "/"): 0o600,
	} {
		if got := fileMode(t, filepath.Join(root, path)); got != mode {
			t.Errorf("%s has mode %v, want %v", path, got, mode)
		}
	}
	if _, err := os.Stat(filepath.Join(root, kubeadmDir, "init.yaml")); !os.IsNotExist(err) {
		t.Error("the init configuration (it holds a bootstrap token) was not removed")
	}
	// Secrets are encrypted in etcd with the KMS v2 KEK derived from the
	// master secret, which the plugin serves from the state disk.
	keks, err := kmsplugin.ReadKEKs(filepath.Join(root, EtcdKEKFile))
	if err != nil {
		t.Fatal(err)
	}
	derive, _ := kms.NewClusterKMS(f.master, f.masterSalt)
	wantKEK, _ := derive.GetDataKey(ctx, keys.EtcdEncryptionKeyID(1), 32)
	if !bytes.Equal(keks[1], wantKEK) || len(keks) != 1 {
		t.Error("the KMS v2 KEK is not generation 1 derived from the master secret")
	}
	if !strings.Contains(initConfig, "name: encryption-provider-config") {
		t.Errorf("the kubeadm configuration does not make the API server encrypt Secrets:\n%s", initConfig)
	}
	if !strings.Contains(initConfig, "imageRepository: mirror.example:5000/registry.k8s.io\n") {
		t.Errorf("the kubeadm configuration does not pull from the request's image repository:\n%s", initConfig)
	}
	if got, _ := os.ReadFile(filepath.Join(root, kms.URIFile)); string(got) != f.req.GetKeyServiceKmsUri() {
		t.Errorf("the key service's KMS URI is %q, want the wrapped secret's URI", got)
	}
	// The master secret is stored only wrapped: no file under the node's
	// root holds it.
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, _ := os.ReadFile(path)
		for _, form := range [][]byte{f.master, []byte(base64.RawURLEncoding.EncodeToString(f.master))} {
			if bytes.Contains(data, form) {
				t.Errorf("%s holds the master secret", path)
			}
		}
		return nil
	})
	if got := f.node.runner.subcommands(); got != "init,token" {
		t.Errorf("kubeadm subcommands %s, want init then token delete", got)
	}
	checkAdminKubeconfig(t, final.GetSuccess().GetKubeconfig(), filepath.Join(root, "etc/kubernetes/pki/ca.crt"))
	// The kubelet's credentials live as long as the request says, not a
	// year: it renews them through CSRs.
	// An hour, and the clock skew certificates allow before now.
	const lifetime = 65 * time.Minute
	if cert := servingCert(t, root); cert.NotAfter.Sub(cert.NotBefore) != lifetime || cert.Subject.CommonName != "system:node:node-1" {
		t.Errorf("kubelet serving certificate %s valid %s to %s, want an hour", cert.Subject, cert.NotBefore, cert.NotAfter)
	}
	kubelet, err := clientcmd.LoadFromFile(filepath.Join(root, kubeadm.KubeletKubeconfigPath))
	if err != nil {
		t.Fatal(err)
	}
	auth := kubelet.AuthInfos[kubelet.Contexts[kubelet.CurrentContext].AuthInfo]
	if cert, err := parsePEMCert(auth.ClientCertificateData); err != nil {
		t.Errorf("kubelet client certificate: %v", err)
	} else if cert.Subject.CommonName != "system:node:node-1" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) ||
		cert.NotAfter.Sub(cert.NotBefore) != lifetime {
		t.Errorf("kubelet client certificate for %s valid %s to %s, want system:node:node-1 in system:nodes for an hour", cert.Subject, cert.NotBefore, cert.NotAfter)
	}
	if cfg, err := clientcmd.Load(final.GetSuccess().GetKubeconfig()); err != nil || cfg.Clusters["gatehouse"] == nil ||
		cfg.Clusters["gatehouse"].Server != "https://api.gatehouse.example:6443" {
		t.Errorf("the admin kubeconfig does not point at the controlPlaneEndpoint: %v %+v", err, cfg)
	}
	if st, _ := bootstrapstatus.Read(root); st.Phase != bootstrapstatus.PhaseDone {
		t.Errorf("status %+v", st)
	}
	select {
	case <-f.server.Delivered():
	default:
		t.Error("the InitServer does not know the result was delivered")
	}
	testkit.AssertNoSecrets(t, f.node.logs.String(), [][]byte{f.secret, f.master, diskKey, []byte(f.req.GetKmsUri())})
}

func checkAdminKubeconfig(t *testing.T, data []byte, caPath string) {
	t.Helper()
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	cert, err := parsePEMCert(user.ClientCertificateData)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "alice" || strings.Join(cert.Subject.Organization, ",") != clusterpki.AdminGroup {
		t.Fatalf("admin certificate subject %s, want CN=alice O=%s", cert.Subject, clusterpki.AdminGroup)
	}
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("admin certificate does not chain to the cluster CA kubeadm used: %v", err)
	}
}

func gunzip(t *testing.T, data []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestInitWrongSecret: PermissionDenied and nothing changed.
func TestInitWrongSecret(t *testing.T) {
	f := newInitFixture(t)
	f.req.InitSecret = random(t, 32)
	stream, err := f.client.Init(t.Context(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := receive(t, stream); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("wrong secret: %v, want PermissionDenied", err)
	}
	f.assertUnchanged(t)
}

// TestInitWithoutHashRefused: a node provisioned without an init secret
// hash (a worker image) cannot be initialised by anyone, whatever secret
// they send: FailedPrecondition, and nothing changed.
func TestInitWithoutHashRefused(t *testing.T) {
	f := newInitFixtureHashed(t, false)
	stream, err := f.client.Init(t.Context(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = receive(t, stream)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "provisioned without an init secret hash") {
		t.Fatalf("init without a hash: %v, want FailedPrecondition naming the missing hash", err)
	}
	f.assertUnchanged(t)
}

func (f *initFixture) assertUnchanged(t *testing.T) {
	t.Helper()
	if f.node.lock.Locked() {
		t.Error("the node lock was taken")
	}
	if ok, _ := f.node.disk.TestKey(t.Context(), f.node.machine.FirstBootKey); !ok {
		t.Error("the first-boot passphrase no longer opens the disk")
	}
	if entries, _ := os.ReadDir(f.node.machine.Root); len(entries) > 0 {
		t.Errorf("files were written: %v", entries)
	}
}

func TestInitInvalidRequest(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*initservicev1.InitRequest)
		want   string
	}{
		"kms": {func(r *initservicev1.InitRequest) { r.KmsUri = "kms://vault?x=1" }, "kms_uri"},
		"key service kms plain": {func(r *initservicev1.InitRequest) {
			r.KeyServiceKmsUri = r.KmsUri
		}, "key_service_kms_uri: want an external KMS URI carrying the wrapped master secret"},
		"key service kms of another cluster": {func(r *initservicev1.InitRequest) {
			r.KeyServiceKmsUri = (&kms.AWSKMSURI{KeyID: "k", Region: "r", WrappedSecret: kms.WrappedSecret{Wrapped: []byte{1}, Salt: bytes.Repeat([]byte{9}, 32)}}).String()
		}, "key_service_kms_uri: its salt differs"},
		"salt":       {func(r *initservicev1.InitRequest) { r.MeasurementSalt = []byte("short") }, "measurement_salt"},
		"components": {func(r *initservicev1.InitRequest) { r.KubernetesComponents[0].Hash = "md5:x" }, "kubernetes_components[0]"},
		"version":    {func(r *initservicev1.InitRequest) { r.KubernetesVersion = "latest" }, "kubernetes version"},
		"cidr":       {func(r *initservicev1.InitRequest) { r.PodCidr = "10.244.0.0" }, "pod CIDR"},
		"image mirror registry": {func(r *initservicev1.InitRequest) {
			r.ImageMirror = &componentsv1.ImageMirror{Registry: "https://mirror.example", Upstreams: []string{"registry.k8s.io"}}
		}, `image_mirror: image mirror: registry "https://mirror.example"`},
		"image mirror upstream": {func(r *initservicev1.InitRequest) {
			r.ImageMirror = &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"../../etc/kubernetes"}}
		}, `image_mirror: image mirror: upstream "../../etc/kubernetes"`},
	} {
		t.Run(name, func(t *testing.T) {
			f := newInitFixture(t)
			tc.mutate(f.req)
			stream, err := f.client.Init(t.Context(), f.req)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = receive(t, stream)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want InvalidArgument naming %q", err, tc.want)
			}
			testkit.AssertNoSecrets(t, err.Error(), [][]byte{f.master, []byte(base64.RawURLEncoding.EncodeToString(f.master))})
			f.assertUnchanged(t)
		})
	}
}

// TestInitResumesAfterDroppedConnection: a client that lost its stream
// sends the same request again and gets the same job's whole stream and
// result; a different request is refused while the first one runs.
func TestInitResumesAfterDroppedConnection(t *testing.T) {
	f := newInitFixture(t)
	ctx, drop := context.WithCancel(t.Context())
	stream, err := f.client.Init(ctx, f.req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	drop()

	other := proto.CloneOf(f.req)
	other.ClusterName = "another"
	stream, err = f.client.Init(t.Context(), other)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := receive(t, stream); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a different request during the init: %v, want FailedPrecondition", err)
	}

	var results [][]byte
	for range 2 { // resume, then ask again after the end
		stream, err := f.client.Init(t.Context(), f.req)
		if err != nil {
			t.Fatal(err)
		}
		steps, final, err := receive(t, stream)
		if err != nil {
			t.Fatal(err)
		}
		// The final message holds a kubeconfig with a key: only its shape is printed.
		if final.GetSuccess() == nil || len(steps) != 8 {
			t.Fatalf("resumed stream: %d steps (want 8), success %t, failure %q", len(steps), final.GetSuccess() != nil, final.GetFailure().GetError())
		}
		results = append(results, final.GetSuccess().GetKubeconfig())
	}
	if !bytes.Equal(results[0], results[1]) {
		t.Fatal("asking again returned another result")
	}
	if got := f.node.runner.subcommands(); got != "init,token" {
		t.Fatalf("kubeadm ran %s: the init ran more than once", got)
	}
}

// TestInitFailureAfterLock: kubeadm init fails; the client gets an
// InitFailure with the logs (no secrets), the disk is marked for reset and
// the status says failed.
func TestInitFailureAfterLock(t *testing.T) {
	f := newInitFixture(t)
	f.node.runner.fail = map[string]int{"init": 1}
	f.node.runner.failOutput = "[wait-control-plane] timed out waiting for the API server"
	f.node.machine.KubeletLogs = func(context.Context) ([]byte, error) {
		return []byte("E1122 kubelet.go:1 \"Failed to run kubelet\" err=\"cgroup v1\""), nil
	}
	stream, err := f.client.Init(t.Context(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	_, final, err := receive(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	failure := final.GetFailure()
	if failure == nil || !strings.Contains(failure.GetError(), "kubeadm init failed") {
		t.Fatalf("final message %v, want a kubeadm init failure", final)
	}
	logs := gunzip(t, failure.GetLogsGzip())
	if !strings.Contains(logs, "timed out waiting for the API server") || !strings.Contains(logs, "Failed to run kubelet") {
		t.Fatalf("failure logs lack kubeadm's or the kubelet's output:\n%s", logs)
	}
	_, diskKey := f.expected(t)
	testkit.AssertNoSecrets(t, logs+f.node.logs.String(), [][]byte{f.secret, f.master, diskKey})
	if st, _ := f.node.disk.State(t.Context()); st != statedisk.ResetRequested {
		t.Errorf("disk state %s, want %s", st, statedisk.ResetRequested)
	}
	if st, _ := bootstrapstatus.Read(f.node.machine.Root); st.Phase != bootstrapstatus.PhaseFailed || !strings.Contains(st.Error, "kubeadm init") {
		t.Errorf("status %+v", st)
	}
	if f.server.Result() == nil {
		t.Error("Result is nil after a failure")
	}
}

// blockingKubeadm runs every kubeadm subcommand as a no-op but init, which
// blocks until its context ends, as a kubeadm init waiting for a control
// plane that does not come up.
type blockingKubeadm struct{ started chan struct{} }

func (b *blockingKubeadm) Run(ctx context.Context, args ...string) ([]byte, error) {
	if args[0] != "init" {
		return nil, nil
	}
	close(b.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStopCancelsInitJob: the init job runs under the server's lifetime,
// not the stream's: Stop (the bootstrapper's SIGTERM) kills a running
// kubeadm init, and the job ends with a failure the client is told about.
func TestStopCancelsInitJob(t *testing.T) {
	f := newInitFixture(t)
	k := &blockingKubeadm{started: make(chan struct{})}
	f.node.machine.Kubeadm = k
	stream, err := f.client.Init(t.Context(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.started:
	case <-time.After(2 * time.Minute):
		t.Fatal("kubeadm init never started")
	}
	f.server.Stop()
	select {
	case <-f.server.Finished():
	case <-time.After(time.Minute):
		t.Fatal("the init job did not end after Stop")
	}
	if err := f.server.Result(); err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("init result after Stop: %v, want the job cancelled", err)
	}
	_, final, err := receive(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if final.GetFailure() == nil {
		t.Fatal("the client was not told the init failed")
	}
}

// TestInitRefusesANameBoundToAnotherMachine: when the new cluster's name
// binding says another machine holds this node's name, the init fails
// (after the node lock) and returns no admin kubeconfig.
func TestInitRefusesANameBoundToAnotherMachine(t *testing.T) {
	f := newInitFixture(t)
	f.bindings.fail = fmt.Errorf("%w: node name cp-0 belongs to tpm-ak:sha256:other", nodebinding.ErrNameBound)
	stream, err := f.client.Init(t.Context(), f.req)
	if err != nil {
		t.Fatal(err)
	}
	_, final, err := receive(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if final.GetSuccess() != nil || !strings.Contains(final.GetFailure().GetError(), "binding the node name") ||
		!strings.Contains(final.GetFailure().GetError(), "belongs to") {
		t.Fatalf("init with the name bound to another machine: success %t, failure %q", final.GetSuccess() != nil, final.GetFailure().GetError())
	}
	if st, _ := bootstrapstatus.Read(f.node.machine.Root); st.Phase != bootstrapstatus.PhaseFailed {
		t.Errorf("status %s, want failed", st.Phase)
	}
}
