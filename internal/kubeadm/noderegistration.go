package kubeadm

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kubeletapis "k8s.io/kubelet/pkg/apis"
)

// What a node registers with beyond its name and address: the taints and
// kubelet arguments of kubeadm's nodeRegistration (kubeadm configuration
// reference v1beta4, NodeRegistrationOptions), the node labels among the
// arguments (the kubelet's --node-labels). Cluster API's attested mode
// carries them from a KubeadmConfig's joinConfiguration to
// gatehouse-bootstrapper's --node-taints and --kubelet-arg flags
// (docs/capi.md): both sides check them with CheckRegistration.

// KubeletArg is one kubelet command-line argument, --Name=Value.
type KubeletArg struct{ Name, Value string }

// NoTaints is the --node-taints value that registers a node without
// taints (kubeadm's taints: []), where no flag means kubeadm's default.
const NoTaints = "none"

// ownedKubeletArgs are kubelet arguments the bootstrapper and kubeadm set
// themselves (the node's identity, credentials and configuration); node
// taints go in the taints list, checked as such.
var ownedKubeletArgs = []string{
	"bootstrap-kubeconfig", "cert-dir", "config", "hostname-override", "kubeconfig", "node-ip",
	"register-with-taints", "rotate-certificates", "rotate-server-certificates", "tls-cert-file", "tls-private-key-file",
}

var (
	kubeletArgName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	// kubeletArgValue is what a value carried in a flag of an environment
	// file may hold: no space, quote, backslash, dollar, percent or brace
	// (nothing systemd, a shell or Jinja would read).
	kubeletArgValue = regexp.MustCompile(`^[A-Za-z0-9._:,/=<>@+\[\]-]*$`)
)

// CheckRegistration checks taints and kubelet arguments for a node's
// registration: taints with a qualified-name key, a label-value value, an
// effect NoSchedule, PreferNoSchedule or NoExecute and no timeAdded, each
// key and effect once; kubelet arguments with lower-case names, once each,
// none of those the bootstrapper sets (ownedKubeletArgs), values of
// letters, digits and ._:,/=<>@+[]- only; node-labels as the kubelet takes
// them (checkNodeLabels). The error names the offending taint or argument.
func CheckRegistration(taints []corev1.Taint, args []KubeletArg) error {
	var errs []error
	seen := map[string]bool{}
	for i, t := range taints {
		if err := checkTaint(t); err != nil {
			errs = append(errs, fmt.Errorf("taints[%d] %q: %w", i, FormatTaints([]corev1.Taint{t}), err))
		}
		if id := t.Key + ":" + string(t.Effect); seen[id] {
			errs = append(errs, fmt.Errorf("taints[%d]: key %q with effect %s is given twice", i, t.Key, t.Effect))
		} else {
			seen[id] = true
		}
	}
	names := map[string]bool{}
	for i, a := range args {
		switch {
		case !kubeletArgName.MatchString(a.Name):
			errs = append(errs, fmt.Errorf("kubeletExtraArgs[%d]: name %q is not a kubelet flag name (lower-case letters, digits and inner hyphens, without the leading --)", i, a.Name))
		case slices.Contains(ownedKubeletArgs, a.Name):
			errs = append(errs, fmt.Errorf("kubeletExtraArgs[%d]: %s is set by gatehouse-bootstrapper and kubeadm (taints go in nodeRegistration.taints)", i, a.Name))
		case names[a.Name]:
			errs = append(errs, fmt.Errorf("kubeletExtraArgs[%d]: %s is given twice", i, a.Name))
		case !kubeletArgValue.MatchString(a.Value):
			errs = append(errs, fmt.Errorf("kubeletExtraArgs[%d] %s: value %q holds a character outside letters, digits and ._:,/=<>@+[]-", i, a.Name, a.Value))
		case a.Name == "node-labels":
			if err := checkNodeLabels(a.Value); err != nil {
				errs = append(errs, fmt.Errorf("kubeletExtraArgs[%d] node-labels: %w", i, err))
			}
		}
		names[a.Name] = true
	}
	return errors.Join(errs...)
}

func checkTaint(t corev1.Taint) error {
	if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
		return fmt.Errorf("key: %s", strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
		return fmt.Errorf("value: %s", strings.Join(errs, "; "))
	}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return fmt.Errorf("effect %q is not NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
	}
	if t.TimeAdded != nil {
		return errors.New("timeAdded is set by the node lifecycle controller, not at registration")
	}
	return nil
}

// checkNodeLabels checks a --node-labels value (key=value pairs separated
// by commas) by the kubelet's rules, which NodeRestriction enforces on the
// API server too (kubelet options, --node-labels; k8s.io/kubelet
// IsKubeletLabel): qualified-name keys, label values, and keys in the
// kubernetes.io or k8s.io namespaces only under kubelet.kubernetes.io or
// node.kubernetes.io or among the labels the kubelet may set
// (kubernetes.io/hostname, topology.kubernetes.io/zone, …). The error
// names each refused label.
func checkNodeLabels(value string) error {
	var errs []error
	seen := map[string]bool{}
	for _, kv := range strings.Split(value, ",") {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("label %q is not key=value", kv))
			continue
		case seen[k]:
			errs = append(errs, fmt.Errorf("label %q is given twice", k))
		case isKubernetesLabel(k) && !kubeletapis.IsKubeletLabel(k):
			errs = append(errs, fmt.Errorf("label %q is in the kubernetes.io or k8s.io namespace, where a kubelet may only set labels under %s or one of %s (NodeRestriction)",
				k, strings.Join(kubeletapis.KubeletLabelNamespaces(), ", "), strings.Join(kubeletapis.KubeletLabels(), ", ")))
		}
		seen[k] = true
		if e := validation.IsQualifiedName(k); len(e) > 0 {
			errs = append(errs, fmt.Errorf("label %q: key: %s", k, strings.Join(e, "; ")))
		}
		if e := validation.IsValidLabelValue(v); len(e) > 0 {
			errs = append(errs, fmt.Errorf("label %q: value %q: %s", k, v, strings.Join(e, "; ")))
		}
	}
	return errors.Join(errs...)
}

// isKubernetesLabel is the kubelet's test of a key in the kubernetes.io or
// k8s.io namespaces.
func isKubernetesLabel(key string) bool {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	ns = strings.ToLower(ns)
	return ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") || ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
}

// FormatTaints writes taints as the kubelet's --register-with-taints does
// (key=value:Effect or key:Effect, separated by commas); NoTaints for an
// empty, non-nil list.
func FormatTaints(taints []corev1.Taint) string {
	if taints != nil && len(taints) == 0 {
		return NoTaints
	}
	parts := make([]string, 0, len(taints))
	for _, t := range taints {
		s := t.Key
		if t.Value != "" {
			s += "=" + t.Value
		}
		parts = append(parts, s+":"+string(t.Effect))
	}
	return strings.Join(parts, ",")
}

// ParseTaints reads FormatTaints' form, and checks each taint
// (CheckRegistration's rules): NoTaints is an empty, non-nil list.
func ParseTaints(s string) ([]corev1.Taint, error) {
	if s == NoTaints {
		return []corev1.Taint{}, nil
	}
	var taints []corev1.Taint
	for _, part := range strings.Split(s, ",") {
		kv, effect, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("taint %q is not key[=value]:Effect", part)
		}
		k, v, _ := strings.Cut(kv, "=")
		taints = append(taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)})
	}
	if err := CheckRegistration(taints, nil); err != nil {
		return nil, err
	}
	return taints, nil
}

// ParseKubeletArg reads a --kubelet-arg value, name=value.
func ParseKubeletArg(s string) (KubeletArg, error) {
	name, value, ok := strings.Cut(s, "=")
	if !ok {
		return KubeletArg{}, fmt.Errorf("kubelet argument %q is not name=value", s)
	}
	return KubeletArg{Name: name, Value: value}, nil
}
