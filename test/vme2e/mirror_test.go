//go:build vmnodes

package vme2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/mini"
)

// The test's cluster takes its images as a cluster without internet does
// (mini up --mirror-images, docs/install-airgapped.md): the cluster's
// registry is the configuration's mirror.registry, it holds every image
// at the mirror's path of its upstream name, and the nodes pull each one
// from there through the containerd hosts files their bootstrapper writes
// from the join ticket's image mirror. On the VM those are the node
// image's: its containerd reads them from /etc/gatehouse/containerd/certs.d
// on the state disk (docs/image.md).

// echoUpstream is the echo workload's name on the VMs: a Docker Hub name
// that exists nowhere but at its mirror path in the cluster's registry, so
// a node runs it only when its containerd pulled it through the mirror.
const echoUpstream = "docker.io/gatehouse-vme2e/echo:1"

// mirrorEcho copies the echo image (as mini load pushed it, at local) to
// the mirror's path of echoUpstream in the registry at reg and returns
// echoUpstream.
func mirrorEcho(ctx context.Context, t *testing.T, local, reg string) string {
	t.Helper()
	src, err := name.NewTag(local, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	mapped, err := (&mirror.Mirror{Registry: reg, PlainHTTP: true}).Image(echoUpstream)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.NewTag(mapped, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("the echo image %s: %v", src, err)
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
		t.Fatalf("pushing the echo image to %s: %v", dst, err)
	}
	t.Logf("the echo image %s is at the mirror's path %s", echoUpstream, dst)
	return echoUpstream
}

// accessLine is a request in the registry's access log (CNCF distribution
// logs each in the combined log format: `<client> - - [<time>] "<method>
// <path> HTTP/1.1" <status> …`) for a manifest, answered 200.
var accessLine = regexp.MustCompile(`(?m)^(\S+) \S+ \S+ \[[^\]]*\] "(?:GET|HEAD) /v2/(\S+)/manifests/\S+ HTTP/[0-9.]+" 200 `)

// manifestPulls counts, per repository path, the manifests the cluster's
// registry in dir served to the client at addr.
func manifestPulls(t *testing.T, dir, addr string) map[string]int {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	pulls := map[string]int{}
	for _, m := range accessLine.FindAllStringSubmatch(string(log), -1) {
		if m[1] == addr {
			pulls[m[2]]++
		}
	}
	return pulls
}

// nodeAddress is Node name's InternalIP.
func nodeAddress(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) string {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("Node %s has no InternalIP: %+v", name, n.Status.Addresses)
	return ""
}

// assertVMPulledFromMirror checks that the VM node pulled the images it
// runs from the mirror registry reg, each at the mirror's path of its
// upstream name: the pause image (containerd's sandbox image,
// registry.k8s.io's name, through the registry.k8s.io hosts file),
// kube-proxy (named by kubeadm's imageRepository, the mirror's, through
// its own hosts file) and the echo workload (echoUpstream, through the
// docker.io hosts file); and nothing at another path of the registry (the
// local names mini load or an unmirrored node use). The image mirror
// reached the VM in its join ticket (the join config's imageMirror). It
// waits (5 min at most) for the pulls and pods, and returns the VM's
// manifest pulls per repository.
func assertVMPulledFromMirror(ctx context.Context, t *testing.T, client kubernetes.Interface, dir, node, reg string) map[string]int {
	t.Helper()
	addr := nodeAddress(ctx, t, client, node)
	wantPulls := []string{"registry.k8s.io/pause", "registry.k8s.io/kube-proxy", echoRepo()}
	wantImages := []string{echoUpstream, reg + "/registry.k8s.io/kube-proxy:"}
	var pulls map[string]int
	var images, missing []string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pulls, images, missing = manifestPulls(t, dir, addr), nil, nil
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.ContainerStatuses {
				if c.State.Running != nil {
					images = append(images, c.Image)
				}
			}
		}
		for _, want := range wantPulls {
			if pulls[want] == 0 {
				missing = append(missing, "a manifest of "+reg+"/"+want+" served to "+addr)
			}
		}
		for _, want := range wantImages {
			if !slices.ContainsFunc(images, func(i string) bool { return strings.HasPrefix(i, want) }) {
				missing = append(missing, "a running container of "+want)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Errorf("%s (%s) did not pull its images through the mirror: no %s (its pulls from the registry: %v; its running images: %v; console: %s)",
			node, addr, strings.Join(missing, ", no "), pulls, images, mini.VMConsoleLog(dir, node))
	}
	t.Logf("manifests the mirror registry served to %s (%s): %v; its running images: %v", node, addr, pulls, images)
	for repo := range pulls {
		if !strings.HasPrefix(repo, "registry.k8s.io/") && !strings.HasPrefix(repo, "docker.io/") {
			t.Errorf("%s pulled %s/%s, not at a mirror's path", node, reg, repo)
		}
	}
	return pulls
}

// echoRepo is echoUpstream's repository path in the mirror registry.
func echoRepo() string {
	repo, _, _ := strings.Cut(echoUpstream, ":")
	return repo
}
