package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// TestMirrorInstall: the local cluster installs as a cluster without
// internet does (docs/install-airgapped.md). Its configuration names a
// mirror (the host's file server on the cluster bridge); every component
// in the join configuration is on the mirror, and the first control plane
// installed each from there with its pinned digest. Its nodes have no
// route out: a connect from a node to the host's own address off the
// bridge, which the host itself reaches, fails at once as unreachable,
// while the mirror answers. Then the mirror serves a changed kubelet: a
// worker that joins refuses it, its bootstrap fails naming the file, its
// mirror URL and both digests, nothing is installed on it and it is no
// Node. Its images come from the mirror too (mini up --mirror-images): the
// cluster's registry as the configuration's mirror.registry, the nodes
// seeded with no image; cp-0 pulled every image it runs from the mirror's
// paths, and an image the mirror serves changed under its pinned digest is
// refused (mirrorimages_test.go). One control plane, no worker at first:
// about a minute and a half.
func TestMirrorInstall(t *testing.T) {
	testenv.RequireRoot(t)
	if err := mini.CheckPrerequisites(); err != nil {
		t.Fatalf("this machine cannot run a local cluster (make setup installs what is missing):\n%v", err)
	}
	bin := clustertest.Binaries(t)
	dir := filepath.Join(t.TempDir(), "mini")
	network, err := mini.FreeNetwork(mini.DefaultNetwork + 2)
	if err != nil {
		t.Fatalf("no network for the test's cluster: %v", err)
	}
	t.Cleanup(func() {
		if out, err := clustertest.Gatehouse(t, bin, "mini", "down", "--dir", dir); err != nil {
			t.Errorf("cleanup: mini down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	out, err := clustertest.Gatehouse(t, bin, "mini", "up", "--dir", dir, "--network", strconv.Itoa(int(network)), "--control-planes", "1", "--workers", "0", "--mirror-images")
	if err != nil {
		t.Fatalf("mini up: %v\n%s\n%s", err, out, nodeLogs(dir))
	}
	t.Logf("mini up took %s", time.Since(start).Round(time.Second))
	ctx := t.Context()
	files := "http://" + net.JoinHostPort(network.HostIP(), "5080")

	cfg, err := clusterconfig.Load(filepath.Join(dir, clusterconfig.DefaultPath))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mirror == nil || cfg.Mirror.Files != files || cfg.Mirror.Registry != network.RegistryAddress() || !cfg.Mirror.PlainHTTP {
		t.Fatalf("the cluster configuration's mirror is %+v, want files %s and registry %s (plain HTTP)", cfg.Mirror, files, network.RegistryAddress())
	}
	client := clustertest.Client(t, filepath.Join(dir, clusterconfig.DefaultKubeconfig))
	joinConfig, err := client.CoreV1().ConfigMaps(charts.Namespace).Get(ctx, "gatehouse-join-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var components []struct{ URL, Hash, InstallPath string }
	if err := json.Unmarshal([]byte(joinConfig.Data["kubernetesComponents"]), &components); err != nil || len(components) == 0 {
		t.Fatalf("the join configuration's components %q: %v", joinConfig.Data["kubernetesComponents"], err)
	}
	var kubelet struct{ URL, Hash, InstallPath string }
	for _, c := range components {
		if !strings.HasPrefix(c.URL, files+"/dl.k8s.io/release/") {
			t.Errorf("component %s comes from %s, not from the mirror %s", c.InstallPath, c.URL, files)
		}
		if c.InstallPath == "/usr/local/bin/kubelet" {
			kubelet = c
		}
	}
	log, err := os.ReadFile(filepath.Join(dir, "nodes", "cp-0", "logs", "bootstrapper.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range components {
		if !strings.Contains(string(log), `"url":"`+c.URL+`","path":"`+c.InstallPath+`"`) {
			t.Errorf("cp-0's bootstrapper did not install %s from %s:\n%s", c.InstallPath, c.URL, log)
		}
	}

	t.Run("no route out: only the cluster network and the mirror", func(t *testing.T) {
		assertNoRouteOut(ctx, t, dir, network, "cp-0")
	})

	t.Run("every image from the mirror registry", func(t *testing.T) {
		assertImagesFromMirror(ctx, t, dir, network, joinConfig.Data["imageMirror"])
	})

	t.Run("a mirror serving a changed image is refused", func(t *testing.T) {
		assertChangedImageRefused(ctx, t, dir, network, client)
	})

	t.Run("a mirror serving a changed kubelet is refused", func(t *testing.T) {
		// The mirror's file server serves <cluster dir>/mirror.
		served := filepath.Join(dir, "mirror", filepath.FromSlash(strings.TrimPrefix(kubelet.URL, files+"/")))
		changed := []byte("#!/bin/sh\necho not the kubelet\n")
		if err := os.Remove(served); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(served, changed, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := clustertest.Gatehouse(t, bin, "mini", "node", "add", "--dir", dir); err != nil {
			t.Fatalf("mini node add: %v\n%s", err, out)
		}
		logPath := filepath.Join(dir, "nodes", "worker-1", "logs", "bootstrapper.log")
		var refusal string
		err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(context.Context) (bool, error) {
			data, _ := os.ReadFile(logPath)
			for line := range strings.SplitSeq(string(data), "\n") {
				if strings.Contains(line, "does not match its pinned sha256 digest") {
					refusal = line
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("worker-1 did not refuse the changed kubelet: %v\n%s", err, nodeLogs(dir))
		}
		for _, want := range []string{"installing /usr/local/bin/kubelet", kubelet.URL, "pinned " + kubelet.Hash, fmt.Sprintf("has sha256:%x", sha256.Sum256(changed))} {
			if !strings.Contains(refusal, want) {
				t.Errorf("worker-1's refusal %s does not name %q", refusal, want)
			}
		}
		// The bootstrap stops there: the node must be reset.
		status := filepath.Join(dir, "nodes", "worker-1", "bootstrap.status")
		err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
			data, _ := os.ReadFile(status)
			return strings.HasPrefix(string(data), "failed"), nil
		})
		if err != nil {
			t.Errorf("worker-1's bootstrap did not end as failed: %v", err)
		}
		ls, err := mini.Exec(ctx, dir, "worker-1", "ls", "-A", "/usr/local/bin")
		if err != nil {
			t.Fatalf("ls on worker-1: %v\n%s", err, ls)
		}
		for _, entry := range strings.Fields(string(ls)) {
			if entry == "kubelet" || entry == "kubeadm" || entry == "kubectl" || strings.HasPrefix(entry, ".gatehouse-") {
				t.Errorf("worker-1 holds /usr/local/bin/%s after the refusal: %s", entry, ls)
			}
		}
		if _, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{}); err == nil {
			t.Error("worker-1 is a Node although it refused its kubelet")
		}
	})
}

// assertNoRouteOut checks from node that the mirror answers and that an
// address off the cluster network is unreachable at once: the host's own
// address on another interface, where a listener of the test answers the
// host itself (so only the node's lack of a route can refuse it).
func assertNoRouteOut(ctx context.Context, t *testing.T, dir string, network mini.Network, node string) {
	t.Helper()
	outside := hostAddressOffBridge(t, network)
	l, err := net.Listen("tcp", net.JoinHostPort(outside.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	target := l.Addr().String()
	if c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", target); err != nil {
		t.Fatalf("the host cannot reach its own %s: %v", target, err)
	} else {
		_ = c.Close()
	}
	connect := func(addr string) (string, error) {
		host, port, _ := net.SplitHostPort(addr)
		out, err := mini.Exec(ctx, dir, node, "timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/"+host+"/"+port)
		return string(out), err
	}
	if out, err := connect(net.JoinHostPort(network.HostIP(), "5080")); err != nil {
		t.Errorf("%s cannot reach the mirror: %v\n%s", node, err, out)
	}
	for _, addr := range []string{target, "192.0.2.1:443", "1.1.1.1:443"} {
		begin := time.Now()
		out, err := connect(addr)
		if err == nil {
			t.Errorf("%s reached %s, off the cluster network", node, addr)
			continue
		}
		// The node's unreachable default route answers EHOSTUNREACH.
		if !strings.Contains(out, "No route to host") || time.Since(begin) > 4*time.Second {
			t.Errorf("%s's connect to %s failed after %s with %q, want \"No route to host\" at once", node, addr, time.Since(begin).Round(time.Millisecond), out)
		}
	}
}

// hostAddressOffBridge is one of the host's IPv4 addresses outside the
// cluster network (not loopback).
func hostAddressOffBridge(t *testing.T, network mini.Network) netip.Addr {
	t.Helper()
	cluster := netip.MustParsePrefix(network.CIDR())
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || cluster.Contains(p.Addr()) || strings.HasPrefix(p.Addr().String(), "10.88.") {
			continue
		}
		return p.Addr()
	}
	t.Fatal("the host has no IPv4 address off the cluster networks to try")
	return netip.Addr{}
}
