package kuberoll

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// Defaults of Options.
const (
	DefaultNodeTimeout  = 15 * time.Minute
	DefaultDrainTimeout = 5 * time.Minute
)

// agent moves one node through its upgrade agent; *AgentClient.
type agent interface {
	Upgrade(ctx context.Context, address string, req *upgradeagentv1.UpgradeRequest, progress func(string)) error
}

// Options configure Run.
type Options struct {
	Client kubernetes.Interface
	Agent  agent
	// Release is where the cluster moves.
	Release versions.Release
	// Components returns the release's kubelet, kubeadm and kubectl for an
	// architecture (the versions table's, or a local build's).
	Components func(arch string) ([]*componentsv1.Component, error)
	// SwitchJoinConfig makes nodes that join from now on get the release
	// (the join configuration), and upgrades Gatehouse's services; called
	// once per run, as soon as the cluster configuration is at the
	// release. It must be idempotent: a resumed roll calls it again.
	SwitchJoinConfig func(ctx context.Context) error
	// Replace names nodes not to move in place, with the reason: they run
	// node software whose reference values are being replaced
	// (upgrade/nodevalues), whose binaries the node's image holds. A new
	// machine with the new software replaces each; the roll names them.
	Replace map[string]string
	// DryRun prints the plan and changes nothing.
	DryRun bool
	// ForceDrain evicts pods no controller manages too (kubectl drain
	// --force); without it such a pod stops the roll.
	ForceDrain bool
	// NodeTimeout bounds one node: drain, kubeadm, kubelet and Ready
	// (DefaultNodeTimeout); DrainTimeout the drain (DefaultDrainTimeout);
	// KubeletTimeout the kubelet's health after its restart (0: the
	// agent's default).
	NodeTimeout, DrainTimeout, KubeletTimeout time.Duration
	Out                                       io.Writer
}

// Run plans the roll, prints the plan and, unless DryRun, moves every
// node that is not at the release yet, one at a time. It stops at the
// first node that fails, leaving that node cordoned, and says how to
// resume. Nodes that joined during the roll at the old version are
// moved by a second pass.
func Run(ctx context.Context, opts Options) error {
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = DefaultNodeTimeout
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	plan, err := makePlan(ctx, opts.Client, opts.Release, opts.Replace)
	if err != nil {
		return err
	}
	plan.Print(opts.Out)
	if opts.DryRun {
		return nil
	}
	r := &roller{opts: opts}
	switched := false
	switchJoinConfig := func() error {
		if switched {
			return nil
		}
		if err := opts.SwitchJoinConfig(ctx); err != nil {
			return fmt.Errorf("switching the join configuration to %s: %w", plan.To, err)
		}
		switched = true
		return nil
	}
	for pass := 0; ; pass++ {
		if plan.From == plan.To {
			// The cluster configuration moved (in this run or one that
			// stopped): joiners must get the release too.
			if err := switchJoinConfig(); err != nil {
				return err
			}
		}
		if plan.Pending() == 0 {
			if r := plan.replaced(); len(r) > 0 {
				fmt.Fprintf(opts.Out, "Every node that moves in place runs Kubernetes %s; to replace with the new node software: %s\n", plan.To, strings.Join(r, ", "))
				return nil
			}
			fmt.Fprintf(opts.Out, "Every node runs Kubernetes %s\n", plan.To)
			return nil
		}
		if pass == 2 {
			return fmt.Errorf("nodes keep joining at an older version than %s: run the upgrade again", plan.To)
		}
		for i, s := range plan.Steps {
			if s.Done || s.Replace != "" {
				continue
			}
			start := time.Now()
			fmt.Fprintf(opts.Out, "[%d/%d] %s\n", i+1, len(plan.Steps), s.Node)
			if err := r.move(ctx, plan, s); err != nil {
				return fmt.Errorf("%s: %w\nThe roll stopped at %s, left as it is (cordoned, if it was drained); the nodes before it are at %s. Fix what is named above and run `gatehouse upgrade apply --kubernetes %s` again: it resumes here", s.Node, err, s.Node, plan.To, plan.To)
			}
			if s.Apply {
				plan.From = plan.To
				if err := switchJoinConfig(); err != nil {
					return err
				}
			}
			fmt.Fprintf(opts.Out, "[%d/%d] %s is Ready at %s (%s)\n", i+1, len(plan.Steps), s.Node, plan.To, time.Since(start).Round(time.Second))
		}
		if plan, err = makePlan(ctx, opts.Client, opts.Release, opts.Replace); err != nil {
			return err
		}
	}
}

type roller struct {
	opts Options
}

// move moves one node: etcd checked (control planes), cordon, drain,
// upgrade through the node's agent, Ready at the release, uncordon.
func (r *roller) move(ctx context.Context, plan *rollPlan, s nodeStep) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.NodeTimeout)
	defer cancel()
	say := func(format string, args ...any) {
		fmt.Fprintf(r.opts.Out, "    "+format+"\n", args...)
	}
	if s.ControlPlane {
		if err := r.etcdHealthy(ctx, plan); err != nil {
			return err
		}
		say("etcd: a healthy member on every control plane")
	}
	comps, err := r.opts.Components(s.Arch)
	if err != nil {
		return err
	}
	req := &upgradeagentv1.UpgradeRequest{
		KubernetesVersion: plan.To, Components: comps, Step: upgradeagentv1.Step_STEP_NODE,
		KubeletTimeoutSeconds: uint32(r.opts.KubeletTimeout / time.Second),
	}
	if s.Apply {
		req.Step = upgradeagentv1.Step_STEP_APPLY
	}
	progress := func(msg string) { say("%s", msg) }
	// kubeadm's order: kubeadm upgrade, then drain, then the kubelet.
	if err := r.opts.Agent.Upgrade(ctx, s.Address, req, progress); err != nil {
		return fmt.Errorf("its upgrade agent: %w", err)
	}
	if err := r.cordon(ctx, s.Node); err != nil {
		return err
	}
	say("cordoned; draining (timeout %s)", r.opts.DrainTimeout)
	if err := r.drain(ctx, s.Node); err != nil {
		return err
	}
	say("drained")
	req.Step = upgradeagentv1.Step_STEP_KUBELET
	if err := r.opts.Agent.Upgrade(ctx, s.Address, req, progress); err != nil {
		return fmt.Errorf("its upgrade agent: %w", err)
	}
	if err := r.waitReady(ctx, s, plan.To); err != nil {
		return err
	}
	say("Ready at %s", plan.To)
	return r.finish(ctx, s.Node, plan.To)
}

// etcdHealthy requires a Ready etcd static pod on every control plane.
func (r *roller) etcdHealthy(ctx context.Context, plan *rollPlan) error {
	var cps []string
	for _, s := range plan.Steps {
		if s.ControlPlane {
			cps = append(cps, s.Node)
		}
	}
	var missing []string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		missing = missing[:0]
		for _, n := range cps {
			if ok, _ := r.podReady(ctx, "etcd-"+n, ""); !ok {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("etcd is not Ready on %s: moving a control plane now could lose quorum", strings.Join(missing, ", "))
	}
	return nil
}

// podReady says whether kube-system/name is Ready and, when tag is
// given, runs images of that tag.
func (r *roller) podReady(ctx context.Context, name, tag string) (bool, error) {
	pod, err := r.opts.Client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	if tag != "" {
		for _, c := range pod.Spec.Containers {
			if !strings.HasSuffix(c.Image, ":"+tag) {
				return false, nil
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

func (r *roller) cordon(ctx context.Context, name string) error {
	node, err := r.opts.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if node.Spec.Unschedulable {
		return nil // cordoned already: by this roll (annotated) or by someone else (left so)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}},"spec":{"unschedulable":true}}`, annotationCordoned)
	if _, err := r.opts.Client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordoning: %w", err)
	}
	return nil
}

// drain evicts the node's pods as kubectl drain does: DaemonSet pods and
// static pods stay, emptyDir data goes, evictions respect
// PodDisruptionBudgets (retried until DrainTimeout).
func (r *roller) drain(ctx context.Context, name string) error {
	var log strings.Builder
	h := &drain.Helper{
		Ctx: ctx, Client: r.opts.Client, Force: r.opts.ForceDrain, GracePeriodSeconds: -1,
		IgnoreAllDaemonSets: true, DeleteEmptyDirData: true, Timeout: r.opts.DrainTimeout,
		Out: &log, ErrOut: &log,
	}
	if err := drain.RunNodeDrain(h, name); err != nil {
		return fmt.Errorf("draining: %w (without --force-drain, pods no controller manages stop the drain; a PodDisruptionBudget that allows no disruption stops it at the timeout)", err)
	}
	return nil
}

// waitReady waits until the node is Ready with the release's kubelet and,
// on a control plane, its API server and etcd are Ready at the release.
func (r *roller) waitReady(ctx context.Context, s nodeStep, version string) error {
	var state string
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		node, err := r.opts.Client.CoreV1().Nodes().Get(ctx, s.Node, metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false, nil
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
		state = fmt.Sprintf("kubelet %s, Ready %t", node.Status.NodeInfo.KubeletVersion, ready)
		if !ready || node.Status.NodeInfo.KubeletVersion != version {
			return false, nil
		}
		if s.ControlPlane {
			if ok, _ := r.podReady(ctx, "kube-apiserver-"+s.Node, version); !ok {
				state = "kube-apiserver not Ready at " + version
				return false, nil
			}
			if ok, _ := r.podReady(ctx, "etcd-"+s.Node, ""); !ok {
				state = "etcd not Ready"
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("not Ready at %s in time (%s)", version, state)
	}
	return nil
}

// finish uncordons a node the roll cordoned and records that it moved.
func (r *roller) finish(ctx context.Context, name, version string) error {
	node, err := r.opts.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:null}}}`, annotationVersion, version, annotationCordoned)
	if node.Annotations[annotationCordoned] == "true" {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:null}},"spec":{"unschedulable":null}}`, annotationVersion, version, annotationCordoned)
	}
	if _, err := r.opts.Client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("uncordoning: %w", err)
	}
	return nil
}
