package bootstrapper

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// TestJoinImageMirror: a joiner writes its ticket's image mirror as
// containerd hosts.toml files under its containerd's config_path before
// kubeadm join runs; a malformed mirror (one that would write outside the
// directory, or name no registry) fails the join before kubeadm, and
// nothing is written.
func TestJoinImageMirror(t *testing.T) {
	const hostsDir = "/etc/gatehouse/containerd/certs.d"
	for _, tc := range []struct {
		name    string
		im      *componentsv1.ImageMirror
		want    map[string]string // upstream → a line its hosts.toml holds
		wantErr string
	}{
		{name: "none", im: nil},
		{name: "plain http", im: &componentsv1.ImageMirror{Registry: "10.88.1.1:5000", PlainHttp: true, Upstreams: []string{"registry.k8s.io", "docker.io"}}, want: map[string]string{
			"registry.k8s.io": `[host."http://10.88.1.1:5000/v2/registry.k8s.io"]`,
			"docker.io":       `[host."http://10.88.1.1:5000/v2/docker.io"]`,
			// kubeadm's images, named by the mirror, over HTTP too.
			"10.88.1.1:5000": `server = "http://10.88.1.1:5000"`,
		}},
		{name: "escaping upstream", im: &componentsv1.ImageMirror{Registry: "10.88.1.1:5000", Upstreams: []string{"docker.io", "../../../etc/kubernetes"}}, wantErr: `upstream "../../../etc/kubernetes"`},
		{name: "no registry", im: &componentsv1.ImageMirror{Upstreams: []string{"docker.io"}}, wantErr: "registry is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var atJoin map[string]string // the files when kubeadm join ran
			f := newJoinFixture(t, false, func(f *joinFixture) {
				f.ticket.ImageMirror = tc.im
				f.n.machine.ContainerdHostsDir = hostsDir
				f.n.runner.onRun = func(args []string) {
					if args[0] == "join" && atJoin == nil {
						atJoin = readHosts(t, filepath.Join(f.n.machine.Root, hostsDir))
					}
				}
			})
			err := f.client.Join(t.Context())
			got := readHosts(t, filepath.Join(f.n.machine.Root, hostsDir))
			if tc.wantErr != "" {
				var failed *FailedError
				if !errors.As(err, &failed) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("join: %v, want a failure naming %q", err, tc.wantErr)
				}
				if atJoin != nil {
					t.Error("kubeadm join ran with a malformed image mirror")
				}
				if len(got) != 0 {
					t.Errorf("files written for a malformed image mirror: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("join: %v\n%s", err, f.n.logs)
			}
			if len(got) != len(tc.want) || len(atJoin) != len(tc.want) {
				t.Fatalf("hosts files %v (at kubeadm join: %v), want ones for %v", got, atJoin, tc.want)
			}
			for upstream, line := range tc.want {
				if !strings.Contains(atJoin[upstream], line) {
					t.Errorf("%s/hosts.toml at kubeadm join lacks %q:\n%s", upstream, line, atJoin[upstream])
				}
			}
		})
	}
}

// readHosts returns dir's <upstream>/hosts.toml files by upstream; none
// when dir does not exist.
func readHosts(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(data)
	}
	return out
}
