package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/mini"
)

// assertImagesFromMirror checks that cp-0 of a mini up --mirror-images
// cluster holds only images it pulled from the mirror registry: the
// control plane's by the mirror's names (kubeadm's imageRepository), the
// pause image by its upstream name through containerd's hosts files (the
// registry logged the pull at its mirror path), the Gatehouse services'
// at their mirror paths, and none of the local images nodes otherwise
// import. imageMirror is the join config's.
func assertImagesFromMirror(ctx context.Context, t *testing.T, dir string, network mini.Network, imageMirror string) {
	t.Helper()
	reg := network.RegistryAddress()
	if !strings.Contains(imageMirror, `"registry":"`+reg+`"`) {
		t.Errorf("the join config's imageMirror is %q, want the registry %s", imageMirror, reg)
	}
	out, err := mini.Exec(ctx, dir, "cp-0", "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		t.Fatalf("listing cp-0's images: %v\n%s", err, out)
	}
	refs := strings.Fields(string(out))
	for _, want := range []string{
		reg + "/registry.k8s.io/kube-apiserver:", reg + "/registry.k8s.io/kube-controller-manager:", reg + "/registry.k8s.io/kube-scheduler:",
		reg + "/registry.k8s.io/etcd:", reg + "/registry.k8s.io/kube-proxy:", "registry.k8s.io/pause:",
		reg + "/docker.io/local/gatehouse-joinservice:", reg + "/docker.io/local/gatehouse-keyservice:",
	} {
		if !slices.ContainsFunc(refs, func(r string) bool { return strings.HasPrefix(r, want) }) {
			t.Errorf("cp-0 has no image %s…: %v", want, refs)
		}
	}
	for _, r := range refs {
		if strings.HasPrefix(r, mini.ImageRepository+"/") {
			t.Errorf("cp-0 holds the local image %s, which it should have pulled from the mirror", r)
		}
	}
	// The pause image's name is registry.k8s.io's: the registry served it
	// at the mirror's path.
	log, err := os.ReadFile(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "/v2/registry.k8s.io/pause/manifests/") {
		t.Errorf("the mirror registry's log shows no pull of registry.k8s.io/pause at its mirror path")
	}
}

// assertChangedImageRefused pushes an image to the mirror at the path of
// docker.io/library/gatehouse-mirror-tamper:1, changes the manifest the
// registry serves under its digest, and runs a pod on cp-0 naming the
// upstream image pinned by that digest: containerd refuses what the
// mirror serves, the pod's status names the image, and no container of it
// ever started.
func assertChangedImageRefused(ctx context.Context, t *testing.T, dir string, network mini.Network, client kubernetes.Interface) {
	t.Helper()
	const upstream = "docker.io/library/gatehouse-mirror-tamper:1"
	dst, err := name.NewTag(network.RegistryAddress()+"/docker.io/library/gatehouse-mirror-tamper:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	// The registry's storage holds the manifest as the blob of its digest;
	// another image's manifest there is what a changed mirror serves.
	other, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := other.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(dir, "registry", "docker", "registry", "v2", "blobs", "sha256", digest.Hex[:2], digest.Hex, "data")
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("the registry's stored manifest: %v", err)
	}
	if err := os.WriteFile(blob, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	pinned := upstream + "@" + digest.String()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mirror-tamper", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "cp-0", Containers: []corev1.Container{{
			Name: "tampered", Image: pinned, ImagePullPolicy: corev1.PullIfNotPresent,
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
		}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	var refusal string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Running != nil || c.State.Terminated != nil || c.ContainerID != "" {
				return false, fmt.Errorf("a container of the changed image started: %+v", c)
			}
			if w := c.State.Waiting; w != nil && w.Reason == "ErrImagePull" {
				refusal = w.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("cp-0 did not refuse the changed image: %v", err)
	}
	t.Logf("cp-0 refused the changed image: %s", refusal)
	// containerd names the image by its digest (a tag beside it is
	// dropped), and both digests.
	changedDigest := fmt.Sprintf("sha256:%x", sha256.Sum256(changed))
	for _, want := range []string{"docker.io/library/gatehouse-mirror-tamper@" + digest.String(), "unexpected commit digest " + changedDigest + ", expected " + digest.String()} {
		if !strings.Contains(refusal, want) {
			t.Errorf("the refusal %q does not name %s", refusal, want)
		}
	}
	if strings.Contains(refusal, "not found") {
		t.Errorf("the refusal %q is for a missing image, not a changed one", refusal)
		return
	}
	out, err := mini.Exec(ctx, dir, "cp-0", "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		t.Fatalf("listing cp-0's images: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "gatehouse-mirror-tamper") {
		t.Errorf("cp-0 keeps the changed image:\n%s", out)
	}
}
