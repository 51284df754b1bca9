package clustertest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// EchoImage builds test/e2e/testdata/echo into an image archive, as a
// user's `docker save` would give, loads it into the cluster's registry
// with `gatehouse mini load`, and returns the reference pods pull.
func EchoImage(t *testing.T, bin, dir string) string {
	t.Helper()
	work := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(work, "echo"), "./test/e2e/testdata/echo")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the echo workload: %v\n%s", err, out)
	}
	archive := filepath.Join(work, "echo.tar")
	err := images.WriteArchive(archive, "amd64", []images.Spec{{
		Ref: "example.com/e2e/echo:1", Files: map[string]string{"echo": filepath.Join(work, "echo")},
		Entrypoint: []string{images.BinDir + "/echo"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Gatehouse(t, bin, "mini", "load", "--dir", dir, archive)
	rec, rerr := mini.ReadRecord(dir)
	if rerr != nil {
		t.Fatal(rerr)
	}
	want := rec.Network.RegistryAddress() + "/e2e/echo:1"
	if err != nil || !strings.Contains(out, "Loaded "+want) {
		t.Fatalf("mini load: %v\n%s", err, out)
	}
	return want
}

// DeployEcho runs the echo server from image as Deployment echo on node,
// behind Service echo (port 80), and waits until it is available.
func DeployEcho(ctx context.Context, t *testing.T, client kubernetes.Interface, image, node string) {
	t.Helper()
	labels := map[string]string{"app": "echo"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{corev1.LabelHostname: node},
					Containers: []corev1.Container{{
						Name: "echo", Image: image, Args: []string{"serve", ":8080"},
						Ports:           []corev1.ContainerPort{{ContainerPort: 8080}},
						SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
					}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitAvailable(ctx, t, client, "default", "echo")
}

// WaitAvailable waits (3 min at most) until every replica of Deployment
// ns/name is available.
func WaitAvailable(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d of %d replicas available", d.Status.AvailableReplicas, ptr.Deref(d.Spec.Replicas, 1))
		return d.Status.AvailableReplicas == ptr.Deref(d.Spec.Replicas, 1) && d.Status.UpdatedReplicas == d.Status.AvailableReplicas, nil
	})
	if err != nil {
		t.Fatalf("Deployment %s/%s is not available: %v (%s)", ns, name, err, last)
	}
}

// AskEcho runs a pod on node that asks the echo Service by its DNS name,
// and checks the answer came from the echo Deployment's pod.
func AskEcho(ctx context.Context, t *testing.T, client kubernetes.Interface, image, node string) {
	t.Helper()
	logs := RunPod(ctx, t, client, image, node, []string{"get", "http://echo.default.svc.cluster.local/"}, nil)
	if !strings.Contains(logs, "hello from echo-") {
		t.Fatalf("a pod on %s asking http://echo.default.svc.cluster.local/ got:\n%s", node, logs)
	}
}

// RunPod runs image with args on node to completion (restartPolicy Never),
// with the node's directory hostDir mounted at /data when set, and returns
// its log. It fails the test when the pod fails.
func RunPod(ctx context.Context, t *testing.T, client kubernetes.Interface, image, node string, args []string, hostDir *string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%s-%d", args[0], node, time.Now().UnixNano()%1_000_000)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "run", Image: image, Args: args,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
			}},
		},
	}
	if hostDir != nil {
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: *hostDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
		}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	})
	// The API server reads the log from the kubelet, whose serving
	// certificate may be renewing (after an outage): retry for a while.
	var logs []byte
	var logErr error
	_ = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		logs, logErr = client.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		return logErr == nil, nil
	})
	if err != nil || phase != corev1.PodSucceeded {
		t.Fatalf("pod %s (%v on %s) ended %q (%v); log (%v):\n%s", name, args, node, phase, err, logErr, logs)
	}
	if logErr != nil {
		t.Fatalf("the log of pod %s: %v", name, logErr)
	}
	return string(logs)
}
