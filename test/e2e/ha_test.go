package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// assertHA waits until the cluster's control planes are exactly cps: as
// many healthy etcd members (none a learner) named after them, each one's
// API server ready at its own address, and a ready join service and key
// service on each.
func assertHA(ctx context.Context, t *testing.T, dir string, client kubernetes.Interface, cps ...string) {
	t.Helper()
	apiClient := apiServerClient(t, dir)
	var state string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		members, err := mini.EtcdMembers(ctx, dir)
		if err != nil {
			state = err.Error()
			return false, nil
		}
		var names []string
		for _, m := range members {
			if !m.Healthy || m.IsLearner {
				state = fmt.Sprintf("etcd member %s: healthy %t, learner %t", m.Name, m.Healthy, m.IsLearner)
				return false, nil
			}
			names = append(names, m.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, cps) {
			state = fmt.Sprintf("etcd members %v, want %v", names, cps)
			return false, nil
		}
		for _, cp := range cps {
			if err := readyz(ctx, apiClient, "https://"+clustertest.NodeIP(t, dir, cp)+":6443"); err != nil {
				state = fmt.Sprintf("the API server of %s: %v", cp, err)
				return false, nil
			}
		}
		for _, ds := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
			d, err := client.AppsV1().DaemonSets(charts.Namespace).Get(ctx, ds, metav1.GetOptions{})
			if err != nil || d.Status.NumberReady != int32(len(cps)) {
				state = fmt.Sprintf("DaemonSet %s: %v %+v", ds, err, d.Status)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the control planes %v are not all serving: %v; last: %s", cps, err, state)
	}
}

// apiServerClient is an HTTPS client trusting the cluster CA, without
// keep-alives: each request opens a connection, as a new client would.
func apiServerClient(t *testing.T, dir string) *http.Client {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(dir, "nodes", "cp-0", "root", "etc", "kubernetes", "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatal("the cluster CA file holds no certificate")
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
	}}
}

// readyz asks the API server at url for /readyz (anonymous, as load
// balancers and kubeadm ask).
func readyz(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// watchAPI asks the API servers through the load balancer for /readyz five
// times a second, each on a new connection and retried once at once (as a
// client would), until stop is called, which returns how many of the
// requests failed and how many there were.
func watchAPI(ctx context.Context, t *testing.T, dir string) (stop func() (failed, total int64)) {
	t.Helper()
	client := apiServerClient(t, dir)
	url := "https://" + clusterNetwork(t, dir).LoadBalancerIP() + ":6443"
	var failed, total atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			total.Add(1)
			err := readyz(ctx, client, url)
			if err != nil {
				err = readyz(ctx, client, url) // the retry
			}
			if err != nil && ctx.Err() == nil {
				failed.Add(1)
			}
		}
	})
	return func() (int64, int64) {
		cancel()
		wg.Wait()
		return failed.Load(), total.Load()
	}
}

// waitRejoined waits until node's bootstrapper finished after since and
// the Node is Ready with a heartbeat after since.
func waitRejoined(ctx context.Context, t *testing.T, dir string, client kubernetes.Interface, node string, since time.Time) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		status, _ := os.ReadFile(filepath.Join(dir, "nodes", node, "bootstrap.status"))
		if strings.TrimSpace(string(status)) != "ok" {
			return false, nil
		}
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && readySince(n, since), nil
	})
	if err != nil {
		t.Fatalf("%s is not back after its reboot: %v\n%s", node, err, nodeLogs(dir))
	}
}

// tokenFor returns the name of the bootstrap token Secret a join service
// issued to node, or "".
func tokenFor(ctx context.Context, client kubernetes.Interface, node string) string {
	secrets, err := client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
	if err != nil {
		return ""
	}
	for _, s := range secrets.Items {
		if strings.HasSuffix(string(s.Data["description"]), "node "+node) {
			return s.Name
		}
	}
	return ""
}

// waitAttested waits until each Node's gatehouse.dev/Attested condition
// has the reason want names (True for Verified, else False).
func waitAttested(ctx context.Context, t *testing.T, client kubernetes.Interface, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for node, reason := range want {
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				got[node] = err.Error()
				return false, nil
			}
			got[node] = "no condition"
			for _, c := range n.Status.Conditions {
				if c.Type == continuous.ConditionType {
					got[node] = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
					if c.Reason != reason || (c.Status == corev1.ConditionTrue) != (reason == continuous.ReasonVerified) {
						return false, nil
					}
				}
			}
			if got[node] == "no condition" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("continuous attestation: want %v; the Nodes' conditions: %v", want, got)
	}
}
