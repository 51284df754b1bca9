// Package kuberoll rolls a cluster to a new Kubernetes release in
// kubeadm's order (https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/):
// control planes first, one at a time (the first runs `kubeadm upgrade
// apply`, the others `kubeadm upgrade node`), then workers one at a time,
// each cordoned and drained (PodDisruptionBudgets respected), moved by its
// own upgrade agent (api/upgradeagent/v1), waited for until Ready at the
// new version, and uncordoned. Where a node stands is read from the
// cluster each run, so a roll that stopped resumes where it stopped.
// docs/upgrades.md describes it.
package kuberoll

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// Annotations the roll keeps on Nodes.
const (
	// annotationVersion is set to the release once the roll moved the node
	// and saw it Ready at that version.
	annotationVersion = "gatehouse.dev/kubernetes-version"
	// annotationCordoned marks a node the roll cordoned, and uncordons
	// once the node moved (a node cordoned by someone else stays so).
	annotationCordoned = "gatehouse.dev/upgrade-cordoned"
	// controlPlaneLabel is kubeadm's control-plane node label.
	controlPlaneLabel = "node-role.kubernetes.io/control-plane"
)

// nodeStep is one node's part of the roll.
type nodeStep struct {
	Node         string
	ControlPlane bool
	// Apply: this node runs `kubeadm upgrade apply` (the first control
	// plane while the cluster configuration is older than the release).
	Apply bool
	// Kubelet is the node's kubelet version now.
	Kubelet string
	// Done: the roll moved the node already (annotationVersion) and it
	// reports the release.
	Done bool
	// Address is the node's InternalIP; Arch its CPU architecture.
	Address, Arch string
	// Replace, when set, says why the node is not moved in place: it runs
	// node software that is being replaced (Options.Replace), so a new
	// machine with the new software takes its place.
	Replace string
}

// rollPlan is what a roll does, in order.
type rollPlan struct {
	// From is the cluster configuration's version (kubeadm-config), To
	// the release.
	From, To string
	Steps    []nodeStep
}

// Pending is the number of nodes still to move.
func (p *rollPlan) Pending() int {
	n := 0
	for _, s := range p.Steps {
		if !s.Done && s.Replace == "" {
			n++
		}
	}
	return n
}

// replaced names the nodes to replace rather than move.
func (p *rollPlan) replaced() []string {
	var out []string
	for _, s := range p.Steps {
		if s.Replace != "" {
			out = append(out, s.Node)
		}
	}
	return out
}

// Print writes the plan for a person.
func (p *rollPlan) Print(w io.Writer) {
	fmt.Fprintf(w, "Kubernetes %s → %s: %d of %d nodes to move, one at a time\n", p.From, p.To, p.Pending(), len(p.Steps))
	for i, s := range p.Steps {
		role := "worker"
		if s.ControlPlane {
			role = "control plane"
		}
		var what string
		switch {
		case s.Replace != "":
			what = fmt.Sprintf("not moved in place: %s; replace it with a machine of the new software, which joins at %s (docs/upgrades.md)", s.Replace, p.To)
		case s.Done:
			what = "already at " + p.To
		case s.Apply:
			what = fmt.Sprintf("etcd checked, kubeadm upgrade apply %s (the cluster configuration, its static pods, kube-proxy, CoreDNS), drain, kubelet %s → %s, Ready, uncordon; then the join configuration names %s", p.To, s.Kubelet, p.To, p.To)
		case s.ControlPlane:
			what = fmt.Sprintf("etcd checked, kubeadm upgrade node (its static pods), drain, kubelet %s → %s, Ready, uncordon", s.Kubelet, p.To)
		default:
			what = fmt.Sprintf("kubeadm upgrade node, drain (PodDisruptionBudgets respected), kubelet %s → %s, Ready, uncordon", s.Kubelet, p.To)
		}
		fmt.Fprintf(w, "  %d. %-16s %-13s %s\n", i+1, s.Node, role, what)
	}
}

// clusterVersion returns the version of the cluster configuration
// kubeadm keeps (kube-system/kubeadm-config, ClusterConfiguration's
// kubernetesVersion).
func clusterVersion(ctx context.Context, client kubernetes.Interface) (string, error) {
	cm, err := client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubeadm-config", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading kubeadm's cluster configuration (kube-system/kubeadm-config): %w", err)
	}
	var cfg struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["ClusterConfiguration"]), &cfg); err != nil {
		return "", fmt.Errorf("kube-system/kubeadm-config's ClusterConfiguration: %w", err)
	}
	if cfg.KubernetesVersion == "" {
		return "", errors.New("kube-system/kubeadm-config's ClusterConfiguration names no kubernetesVersion")
	}
	return cfg.KubernetesVersion, nil
}

// makePlan reads the cluster and plans the roll to release; a release
// the cluster may not move to (versions.CheckUpgrade) is refused before
// anything changes, and so is a node without an InternalIP. Nodes in
// replace (name → why) are planned for replacement, not moved.
func makePlan(ctx context.Context, client kubernetes.Interface, release versions.Release, replace map[string]string) (*rollPlan, error) {
	from, err := clusterVersion(ctx, client)
	if err != nil {
		return nil, err
	}
	if err := versions.CheckUpgrade(from, release); err != nil {
		return nil, err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	p := &rollPlan{From: from, To: release.Version}
	applied := from == release.Version
	for _, n := range nodes.Items {
		s := nodeStep{Node: n.Name, Kubelet: n.Status.NodeInfo.KubeletVersion, Arch: n.Status.NodeInfo.Architecture}
		_, s.ControlPlane = n.Labels[controlPlaneLabel]
		s.Done = n.Annotations[annotationVersion] == release.Version && s.Kubelet == release.Version
		if !s.Done {
			s.Replace = replace[n.Name]
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && s.Address == "" {
				s.Address = a.Address
			}
		}
		if s.Address == "" && !s.Done && s.Replace == "" {
			return nil, fmt.Errorf("node %s reports no InternalIP: its upgrade agent cannot be reached", n.Name)
		}
		if newer, err := versions.Newer(s.Kubelet, release.Version); err == nil && newer {
			return nil, fmt.Errorf("node %s runs kubelet %s, newer than %s: a kubelet is never moved back", n.Name, s.Kubelet, release.Version)
		}
		p.Steps = append(p.Steps, s)
	}
	// Control planes first, in each group the nodes that move in place
	// before those to replace, then by name; the first control plane
	// that moves in place applies the cluster configuration.
	slices.SortFunc(p.Steps, func(a, b nodeStep) int {
		if a.ControlPlane != b.ControlPlane {
			if a.ControlPlane {
				return -1
			}
			return 1
		}
		if (a.Replace == "") != (b.Replace == "") {
			if a.Replace == "" {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Node, b.Node)
	})
	if !applied {
		if len(p.Steps) == 0 || !p.Steps[0].ControlPlane || p.Steps[0].Replace != "" {
			return nil, fmt.Errorf("the cluster has no control-plane node (label %s) that moves in place to run kubeadm upgrade apply: replace the control planes before the roll (docs/upgrades.md)", controlPlaneLabel)
		}
		p.Steps[0].Apply, p.Steps[0].Done = true, false
	}
	return p, nil
}
