package mini

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The API servers' load balancer of a cluster with more than one control
// plane: Debian's haproxy on the host, at the network's LoadBalancerIP on
// the cluster bridge, configured as kubeadm's HA guide does ("Options for software
// load balancing", docs/quickstart.md "High availability"): TCP passed
// through to every control plane's API server, each health-checked with
// GET /readyz over TLS (not /healthz: an API server that starts answers
// /healthz before it serves, and one that shuts down still answers it). It
// is the cluster's controlPlaneEndpoint.
const apiServerPort = 6443

// haproxyConfig is the load balancer's configuration on network nw for the
// API servers at backends (IPs). A server is taken out after two failed checks a
// second apart and put back after two good ones, so a stopped control
// plane stops getting connections within about two seconds; connections
// refused on the way are retried on another server (redispatch). The
// connections a server held are closed when it is taken out
// (on-marked-down shutdown-sessions): a kubelet's HTTP/2 connection to an
// API server that restarts (an upgrade, a reboot) otherwise stalls until
// its health check gives up, about 45 s, and its node's heartbeats with
// it, long enough for the node lifecycle controller to mark the node and
// its pods NotReady (docs/upgrades.md, "What the workload sees").
func haproxyConfig(nw Network, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by gatehouse mini up: the API servers' load balancer.
global
    maxconn 4096

defaults
    mode tcp
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 20m
    timeout server 20m
    timeout check 2s

frontend apiserver
    bind %s
    default_backend apiservers

backend apiservers
    option httpchk
    http-check connect ssl
    http-check send meth GET uri /readyz
    http-check expect status 200
    balance roundrobin
    default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
`, nw.loadBalancerEndpoint())
	for _, ip := range backends {
		fmt.Fprintf(&b, "    server %s %s check verify none\n", ip, net.JoinHostPort(ip, fmt.Sprint(apiServerPort)))
	}
	return b.String()
}

// startLoadBalancer gives the host the LoadBalancerIP of rec's network on
// its bridge and starts haproxy there for the API servers at backends,
// recorded in rec.
func startLoadBalancer(ctx context.Context, rec *Record, backends []string) error {
	nw := rec.Network
	if err := run(ctx, "ip", "addr", "add", nw.LoadBalancerIP()+"/24", "dev", nw.Bridge()); err != nil {
		return err
	}
	cfg := filepath.Join(rec.Dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(nw, backends)), 0o644); err != nil { //nolint:gosec // addresses only
		return err
	}
	if out, err := exec.CommandContext(ctx, "haproxy", "-c", "-f", cfg).CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy refuses its configuration %s: %w\n%s", cfg, err, out)
	}
	// -db: stay in the foreground, so the recorded PID is haproxy's.
	return startHostProcess(ctx, rec, &rec.LoadBalancerPID, "haproxy", "listen on "+nw.loadBalancerEndpoint(), []string{"haproxy", "-db", "-f", cfg},
		func() (bool, error) {
			c, err := net.DialTimeout("tcp", nw.loadBalancerEndpoint(), time.Second)
			if err != nil {
				return false, nil
			}
			return true, c.Close()
		})
}

// waitLoadBalancer waits until the load balancer of network nw routes to a
// ready API server: haproxy takes a server in after two good health checks a second
// apart, so right after kubeadm init it may still refuse. ca is the
// cluster CA (PEM).
func waitLoadBalancer(ctx context.Context, nw Network, ca []byte) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return errors.New("the cluster CA holds no certificate")
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
	}}
	url := "https://" + nw.loadBalancerEndpoint() + "/readyz"
	return poll(ctx, 200*time.Millisecond, 2*time.Minute, "the load balancer to route to a ready API server", func() (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}
