package mini

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// The local cluster installs the way a cluster without internet does
// (docs/install-airgapped.md): its configuration names a mirror, and every
// node downloads its Kubernetes components from the mirror's file server
// at their mirror paths (<files>/dl.k8s.io/release/<version>/bin/linux/
// amd64/kubelet, …), checked against their sha256 digests. The mirror is
// the host on the cluster bridge: a file server (`gatehouse mini
// serve-mirror`, MirrorPort) serving the local Kubernetes build there,
// beside the cluster's registry (Network.RegistryAddress). The nodes have
// no route beyond the host: the host does not forward their packets
// (test/e2e checks a connect beyond it fails).

// mirrorPort is the file server's port on the host's bridge address.
const mirrorPort = 5080

// mirrorURL is the base URL of the cluster's mirror file server.
func (n Network) mirrorURL() string {
	return "http://" + net.JoinHostPort(n.HostIP(), strconv.Itoa(mirrorPort))
}

// mirrorFilesDir is the file server's root in the cluster directory.
func mirrorFilesDir(dir string) string { return filepath.Join(dir, "mirror") }

// mirrorComponents lays the local build of kubeBin out in the cluster's
// mirror (kubelet, kubeadm and kubectl at the versions table's mirror
// paths: links to the multi-call binary "kube") and returns the
// components as the nodes install them: the mirror's URLs with the local
// build's sha256 (versions.Release.LocalBuild). crictl and the CNI plugins
// have no local build; the nodes use Debian's.
func mirrorComponents(dir string, nw Network, version, kubeBin string) ([]*componentsv1.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, err
	}
	local, err := release.LocalBuild("amd64", kubeBin)
	if err != nil {
		return nil, err
	}
	official, err := release.Components("amd64")
	if err != nil {
		return nil, err
	}
	m := &mirror.Mirror{Files: nw.mirrorURL()}
	kube, err := filepath.Abs(filepath.Join(kubeBin, "kube"))
	if err != nil {
		return nil, err
	}
	out := make([]*componentsv1.Component, 0, len(local))
	for _, c := range local {
		var from string
		for _, o := range official {
			if o.InstallPath == c.GetInstallPath() {
				from = o.URL
			}
		}
		if from == "" {
			return nil, fmt.Errorf("the versions table has no component installed to %s", c.GetInstallPath())
		}
		rel, err := mirror.Path(from)
		if err != nil {
			return nil, err
		}
		link := filepath.Join(mirrorFilesDir(dir), filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil { //nolint:gosec // served to the nodes
			return nil, err
		}
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if err := os.Symlink(kube, link); err != nil {
			return nil, err
		}
		u, err := m.FileURL(from)
		if err != nil {
			return nil, err
		}
		out = append(out, &componentsv1.Component{Url: u, Hash: c.GetHash(), InstallPath: c.GetInstallPath()})
	}
	return out, nil
}

// startMirror starts the cluster's mirror file server (gatehouse mini
// serve-mirror of gatehouse) and waits until it answers, recording its PID.
func startMirror(ctx context.Context, rec *Record, gatehouse string) error {
	addr := net.JoinHostPort(rec.Network.HostIP(), strconv.Itoa(mirrorPort))
	dir := mirrorFilesDir(rec.Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // served to the nodes
		return err
	}
	client := &http.Client{Timeout: time.Second}
	return startHostProcess(ctx, rec, &rec.MirrorPID, "mirror", "answer at "+addr,
		[]string{gatehouse, "mini", "serve-mirror", "--dir", dir, "--address", addr}, func() (bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodHead, "http://"+addr+"/", nil)
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

// ServeMirror serves the files under dir over plain HTTP at address
// (host:port) until ctx ends: the local cluster's mirror file server.
// Links are followed (the local build is linked in, mirrorComponents).
// What it serves is checked by the nodes against pinned digests, so
// plain HTTP loses nothing.
func ServeMirror(ctx context.Context, dir, address string) error {
	srv := &http.Server{Addr: address, Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving the mirror at %s: %w", address, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown) //nolint:contextcheck // ctx is done: the shutdown gets its own deadline
}
