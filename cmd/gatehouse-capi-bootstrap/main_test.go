package main_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller/controllertest"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const (
	// leaseName is the binary's leader election ID.
	leaseName = "gatehouse-capi-bootstrap.bootstrap.gatehouse.dev"
	// controllerName is the KubeadmConfig controller's name in metrics.
	controllerName = "kubeadmconfig"
	// deadline bounds every wait: starting, electing, reconciling, handing
	// over; generous, for a loaded 2-vCPU machine.
	deadline = 90 * time.Second
)

// replica is one running gatehouse-capi-bootstrap.
type replica struct {
	name    string
	proc    *testenv.Process
	metrics string // http://127.0.0.1:<port>/metrics
	probes  string // http://127.0.0.1:<port>, serving /healthz and /readyz
}

// TestLeaderElection runs two replicas of the real binary against a real
// API server with --leader-elect: exactly one holds the Lease, both are
// healthy and ready, and only the leader reconciles, turning a worker's
// KubeadmConfig into its data Secret. SIGTERM to the leader makes it exit
// cleanly and release the Lease; the other replica takes it and renders
// the next worker's data.
func TestLeaderElection(t *testing.T) {
	e := controllertest.NewEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)

	bin := testenv.BuildBinary(t, "github.com/gatehouse-dev/gatehouse/cmd/gatehouse-capi-bootstrap")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, testenv.Kubeconfig(t, e.Config), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := testenv.FreeAddrs(t, 4)
	replicas := make([]*replica, 2)
	for i := range replicas {
		metricsAddr, probeAddr := addrs[2*i], addrs[2*i+1]
		name := fmt.Sprintf("replica-%d", i)
		replicas[i] = &replica{
			name:    name,
			metrics: "http://" + metricsAddr + "/metrics",
			probes:  "http://" + probeAddr,
			proc: testenv.StartProcess(t, name, bin,
				"--kubeconfig", kubeconfig,
				"--leader-elect=true",
				"--leader-election-namespace", ns,
				"--metrics-bind-address", metricsAddr, "--metrics-secure=false",
				"--health-probe-bind-address", probeAddr),
		}
	}

	// 1. Both healthy and ready; exactly one leads.
	for _, r := range replicas {
		eventually(t, r.name+" healthy and ready", replicas, func(ctx context.Context) error {
			for _, path := range []string{"/healthz", "/readyz"} {
				if _, err := get(ctx, r.probes+path); err != nil {
					return err
				}
			}
			return nil
		})
	}
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var leader, follower *replica
	var holder string
	eventually(t, "exactly one leader", replicas, func(ctx context.Context) error {
		var err error
		if holder, err = leaseHolder(ctx, e.Client, ns); err != nil {
			return err
		}
		var leaders []*replica
		for _, r := range replicas {
			leads, err := r.leads(ctx)
			if err != nil {
				return err
			}
			if leads {
				leaders = append(leaders, r)
			} else {
				follower = r
			}
		}
		if len(leaders) != 1 {
			return fmt.Errorf("%d replicas report leading; Lease held by %q", len(leaders), holder)
		}
		leader = leaders[0]
		return nil
	})
	// controller-runtime's identity: the host name and a UUID per process.
	if !strings.HasPrefix(holder, hostname+"_") {
		t.Fatalf("Lease %s/%s held by %q, want %q and a UUID", ns, leaseName, holder, hostname+"_")
	}
	t.Logf("%s leads as %s", leader.name, holder)

	// 2. Only the leader reconciles.
	workerData(t, e, cluster, "worker-0", bootstrapv1.FormatCloudConfig, replicas)
	leader.reconciled(t, replicas)
	leader.expectLeading(t)
	follower.expectIdle(t)
	if got, err := leaseHolder(t.Context(), e.Client, ns); err != nil || got != holder {
		t.Fatalf("Lease held by %q (%v) after the reconcile, want still %q", got, err, holder)
	}

	// 3. SIGTERM: the leader exits cleanly and releases the Lease, the
	// follower takes it and reconciles.
	if err := leader.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	waitCtx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	if err := leader.proc.Wait(waitCtx); err != nil {
		t.Fatalf("%s after SIGTERM: %v, want exit status 0", leader.name, err)
	}
	// LeaderElectionReleaseOnCancel: the Lease is released before the
	// manager returns, so the follower need not wait for it to expire.
	lease := &coordinationv1.Lease{}
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: leaseName}, lease); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got == holder {
		t.Fatalf("%s exited still holding the Lease", leader.name)
	}
	survivor := []*replica{follower}
	var newHolder string
	eventually(t, follower.name+" takes the Lease", survivor, func(ctx context.Context) error {
		var err error
		if newHolder, err = leaseHolder(ctx, e.Client, ns); err != nil {
			return err
		}
		if newHolder == holder {
			return fmt.Errorf("Lease still held by the stopped leader %q", holder)
		}
		leads, err := follower.leads(ctx)
		if err != nil {
			return err
		}
		if !leads {
			return fmt.Errorf("%s does not report leading; Lease held by %q", follower.name, newHolder)
		}
		return nil
	})
	t.Logf("%s leads as %s, %s after SIGTERM to %s", follower.name, newHolder, time.Since(stopped).Round(time.Millisecond), leader.name)
	workerData(t, e, cluster, "worker-1", bootstrapv1.FormatIgnition, survivor)
	follower.reconciled(t, survivor)
}

// eventually polls check every 200 ms until it returns nil. It fails the
// test with check's last error when deadline passes, or at once when one of
// running exits.
func eventually(t *testing.T, what string, running []*replica, check func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	var last error
	for {
		err := check(ctx)
		if err == nil {
			return
		}
		if ctx.Err() == nil || last == nil { // not the deadline cutting a check short
			last = err
		}
		for _, r := range running {
			if r.proc.Exited() {
				t.Fatalf("waiting for %s: %s exited: %v", what, r.name, r.proc.Wait(ctx))
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: no success in %s; last: %v", what, deadline, last)
		case <-ticker.C:
		}
	}
}

// leaseHolder returns the holder of the binary's leader election Lease in
// ns, or an error if there is none.
func leaseHolder(ctx context.Context, c client.Client, ns string) (string, error) {
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: leaseName}, lease); err != nil {
		return "", fmt.Errorf("reading the Lease: %w", err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if holder == "" {
		return "", fmt.Errorf("Lease %s/%s has no holder", ns, leaseName)
	}
	return holder, nil
}

// workerData creates a worker Machine of cluster with a KubeadmConfig of
// format and waits until its data Secret holds a join configuration with
// a bootstrap token.
func workerData(t *testing.T, e *controllertest.Env, cluster *clusterv1.Cluster, name string, format bootstrapv1.Format, running []*replica) {
	t.Helper()
	ctx := t.Context()
	_, cfg, err := e.Machine(ctx, cluster, name, false, bootstrapv1.KubeadmConfigSpec{Format: format})
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{}
	eventually(t, name+"'s data Secret", running, func(ctx context.Context) error {
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
			return err
		}
		if cfg.Status.DataSecretName == nil {
			return fmt.Errorf("%s has no status.dataSecretName; conditions %+v", name, cfg.Status.Conditions)
		}
		return e.Client.Get(ctx, client.ObjectKey{Namespace: cfg.Namespace, Name: *cfg.Status.DataSecretName}, s)
	})
	if s.Type != clusterv1.ClusterSecretType || string(s.Data["format"]) != string(format) || !metav1.IsControlledBy(s, cfg) {
		t.Fatalf("%s's data Secret %s: type %q, format %q (want %q), owners %v", name, s.Name, s.Type, s.Data["format"], format, s.OwnerReferences)
	}
	join := string(rendertest.Files(t, format, s.Data["value"])[render.KubeadmConfigPathFor(format)])
	if !strings.Contains(join, "kind: JoinConfiguration") || !strings.Contains(join, "token: ") {
		t.Fatalf("%s's data has no join configuration with a bootstrap token:\n%s", name, join)
	}
}

// leads reports whether r says, in its metrics, that it holds the Lease.
func (r *replica) leads(ctx context.Context) (bool, error) {
	body, err := get(ctx, r.metrics)
	if err != nil {
		return false, err
	}
	v, ok := sample(body, "leader_election_master_status", map[string]string{"name": leaseName})
	return ok && v == 1, nil
}

// reconciled waits until r's metrics count a reconcile of the controller,
// of any result: a config with a bootstrap token is requeued for its
// refresh ("requeue_after"), not counted as "success".
func (r *replica) reconciled(t *testing.T, running []*replica) {
	t.Helper()
	eventually(t, r.name+" counting a reconcile", running, func(ctx context.Context) error {
		body, err := get(ctx, r.metrics)
		if err != nil {
			return err
		}
		if v, ok := sample(body, "controller_runtime_reconcile_total", map[string]string{"controller": controllerName}); !ok || v < 1 {
			return fmt.Errorf("%s: controller_runtime_reconcile_total{controller=%q} sums to %v (present %v)", r.name, controllerName, v, ok)
		}
		return nil
	})
}

// expectLeading fails the test unless r's log shows its controller started.
func (r *replica) expectLeading(t *testing.T) {
	t.Helper()
	if !strings.Contains(r.proc.Log(), `"msg":"Starting workers"`) {
		t.Errorf("the leader %s never logged starting its workers", r.name)
	}
}

// expectIdle fails the test unless r, which does not lead, serves metrics
// without reconcile counts of the controller and never started it.
func (r *replica) expectIdle(t *testing.T) {
	t.Helper()
	body, err := get(t.Context(), r.metrics)
	if err != nil {
		t.Fatalf("the follower's /metrics: %v", err)
	}
	if v, ok := sample(body, "controller_runtime_reconcile_total", map[string]string{"controller": controllerName}); ok {
		t.Errorf("the follower %s counts reconciles: controller_runtime_reconcile_total %v", r.name, v)
	}
	if v, ok := sample(body, "leader_election_master_status", map[string]string{"name": leaseName}); ok && v != 0 {
		t.Errorf("the follower %s reports leader_election_master_status %v", r.name, v)
	}
	if strings.Contains(r.proc.Log(), `"msg":"Starting workers"`) {
		t.Errorf("the follower %s started the controller's workers", r.name)
	}
}

// get GETs url and returns the body of a 200 answer.
func get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %.512s", url, resp.Status, body)
	}
	return string(body), nil
}

// sample returns the sum of the samples of metric name whose labels
// include want, in body, a Prometheus text exposition, and whether there
// were any.
func sample(body, name string, want map[string]string) (float64, bool) {
	sum, found := 0.0, false
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') { // a comment or a longer name
			continue
		}
		labels := map[string]string{}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			labels, rest = parseLabels(rest[1:end]), rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 || !includes(labels, want) {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		sum, found = sum+v, true
	}
	return sum, found
}

// parseLabels parses a sample's `k="v",...` labels; values are escaped as
// Go string literals are.
func parseLabels(s string) map[string]string {
	labels := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, "=")
		if !ok {
			break
		}
		quoted, err := strconv.QuotedPrefix(rest)
		if err != nil {
			break
		}
		v, err := strconv.Unquote(quoted)
		if err != nil {
			break
		}
		labels[strings.TrimSpace(k)] = v
		s = strings.TrimPrefix(rest[len(quoted):], ",")
	}
	return labels
}

func includes(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestSecureMetrics: by default /metrics is HTTPS and answers only callers
// the API server authenticates and authorizes: no token gets 401, a
// ServiceAccount without the right gets 403, one bound to get /metrics
// gets the metrics.
func TestSecureMetrics(t *testing.T) {
	e := controllertest.NewEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	bin := testenv.BuildBinary(t, "github.com/gatehouse-dev/gatehouse/cmd/gatehouse-capi-bootstrap")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, testenv.Kubeconfig(t, e.Config), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := testenv.FreeAddrs(t, 2)
	r := &replica{name: "secure", metrics: "https://" + addrs[0] + "/metrics", probes: "http://" + addrs[1],
		proc: testenv.StartProcess(t, "secure", bin, "--kubeconfig", kubeconfig, "--leader-elect=false",
			"--metrics-bind-address", addrs[0], "--health-probe-bind-address", addrs[1])}

	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(name string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("metrics-reader"), token("stranger")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-reader-"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if role, err = cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-reader-"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "metrics-reader"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The server's certificate is self-signed: only TLS itself is checked here.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}
	status := func(ctx context.Context, bearer string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.metrics, nil)
		if err != nil {
			return 0, err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	for _, tc := range []struct {
		who    string
		bearer string
		want   int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a ServiceAccount without the right", stranger, http.StatusForbidden},
		{"a ServiceAccount bound to get /metrics", reader, http.StatusOK},
	} {
		eventually(t, fmt.Sprintf("%s getting %d", tc.who, tc.want), []*replica{r}, func(ctx context.Context) error {
			got, err := status(ctx, tc.bearer)
			if err != nil {
				return err
			}
			if got != tc.want {
				return fmt.Errorf("%s: %d, want %d", tc.who, got, tc.want)
			}
			return nil
		})
	}
}
