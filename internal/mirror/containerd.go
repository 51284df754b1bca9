package mirror

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// dockerHubHost is where Docker Hub serves the registry API.
const dockerHubHost = "registry-1.docker.io"

// ContainerdHosts returns containerd's hosts.toml for pulls from upstream
// (a registry host such as registry.k8s.io or docker.io), sending them to
// the mirror's registry at the mapped path (Image's mapping:
// <registry>/<upstream>/<repository>), for a node's
// /etc/containerd/certs.d/<upstream>/hosts.toml (containerd's
// config_path; containerd docs/hosts.md). So every image a node's
// containerd pulls by that registry's names comes from the mirror: the
// pause image, the control plane's, workloads'. plainHTTP speaks HTTP to
// the mirror instead of HTTPS. containerd checks every blob's digest as
// it pulls, whatever the host.
func (m *Mirror) ContainerdHosts(upstream string, plainHTTP bool) ([]byte, error) {
	if m == nil || m.Registry == "" {
		return nil, errors.New("containerd hosts need the mirror's registry")
	}
	reg, err := name.NewRegistry(upstream)
	if err != nil || strings.Contains(upstream, "/") {
		return nil, fmt.Errorf("upstream registry %q is not a host[:port]", upstream)
	}
	server := reg.RegistryStr()
	if server == name.DefaultRegistry {
		server = dockerHubHost
	}
	scheme := "https"
	if plainHTTP {
		scheme = "http"
	}
	host, prefix, _ := strings.Cut(m.Registry, "/")
	path := "/v2/"
	if prefix != "" {
		path += prefix + "/"
	}
	path += registryName(reg.RegistryStr())
	return fmt.Appendf(nil, `# Pulls of %[1]s images come from the mirror (gatehouse mirror containerd-hosts;
# docs/install-airgapped.md). containerd checks every blob's digest.
server = "https://%[2]s"

[host."%[3]s://%[4]s%[5]s"]
  capabilities = ["pull", "resolve"]
  override_path = true
`, registryName(reg.RegistryStr()), server, scheme, host, path), nil
}
