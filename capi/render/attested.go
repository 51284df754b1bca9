package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Attested mode: the data only configures gatehouse-bootstrapper through
// BootstrapperEnvPathFor(format), a systemd EnvironmentFile whose
// GATEHOUSE_BOOTSTRAPPER_ARGS the image's unit expands, split at
// whitespace, into the bootstrapper's flags (config/systemd). Every value
// is validated before it is written, and what reaches the file is drawn
// from a character set that needs no quoting for systemd or for the flag
// parser: a value cannot end the line, the quotes or a flag.

// maxAttestedDataSize is what attested-mode data of a joining worker
// stays within, raw, in both formats: far below the smallest common cloud
// user-data limit, so user data never needs a bucket in attested mode.
const maxAttestedDataSize = 2 << 10

// dnsName is an RFC 1123 host name: labels of letters, digits and inner
// hyphens.
var dnsName = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

// caHash is kubeadm's discovery token CA cert hash.
var caHash = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// envSafe is what an argument written into the environment file may hold:
// nothing systemd, a shell or Jinja would read ("=<>@+" for node labels,
// taints and kubelet arguments, checked by kubeadm.CheckRegistration).
var envSafe = regexp.MustCompile(`^[A-Za-z0-9._:,/=<>@+\[\]-]+$`)

// ErrAttestedSpec is a spec value attested mode refuses: one it cannot
// carry to the machine, or one the machine's kubelet or NodeRestriction
// would refuse. The controller reports it as InvalidSpec.
var ErrAttestedSpec = errors.New("attested mode")

// joinEndpoint checks a join service endpoint: host:port with a DNS name
// or an IP address (IPv6 in brackets, without a zone) and a port 1-65535.
func joinEndpoint(ep string) error {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return err
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 || port[0] == '0' {
		return fmt.Errorf("port %q is not 1-65535", port)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return fmt.Errorf("host %q has a zone", host)
		}
		if addr.Is6() && !strings.HasPrefix(ep, "[") {
			return fmt.Errorf("IPv6 host %q needs brackets", host)
		}
		return nil
	}
	if len(host) > 253 || !dnsName.MatchString(host) {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	return nil
}

// bootstrapperArgs are gatehouse-bootstrapper's flags in attested mode. The
// init machine gets no join endpoints: it waits for `gatehouse init` over
// attested TLS. Joining machines pin the cluster CA by its hash.
func bootstrapperArgs(in Input) ([]string, error) {
	args := []string{"--success-file", sentinelPath}
	if in.Role == RoleInit {
		if fields := uncarriedInitFields(in.Spec); len(fields) > 0 {
			return nil, fmt.Errorf("%w: %s not carried to the machine (an attested init machine takes its configuration from "+
				"`gatehouse init`, docs/capi.md): remove them, and give them to gatehouse init", ErrAttestedSpec, strings.Join(fields, ", "))
		}
		return args, nil
	}
	endpoints := in.Spec.Attested.JoinEndpoints
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("attested join: no join endpoints (spec.attested.joinEndpoints)")
	}
	for i, ep := range endpoints {
		if err := joinEndpoint(ep); err != nil {
			return nil, fmt.Errorf("spec.attested.joinEndpoints[%d] %q: want host:port: %w", i, ep, err)
		}
	}
	if !caHash.MatchString(in.ClusterCAHash) {
		return nil, fmt.Errorf("attested join: the cluster CA hash %q to pin the join service to is not sha256:<64 hex digits>", in.ClusterCAHash)
	}
	args = append(args, "--join-endpoints", strings.Join(endpoints, ","), "--cluster-ca-hash", in.ClusterCAHash)
	if in.ControlPlane {
		args = append(args, "--control-plane")
	}
	reg, err := nodeRegistrationArgs(in.Spec.JoinConfiguration)
	if err != nil {
		return nil, err
	}
	return append(args, reg...), nil
}

// nodeRegistrationArgs carries a join's node registration to the
// bootstrapper, which puts it into its `kubeadm join` configuration:
// nodeRegistration.taints as --node-taints (kubeadm.FormatTaints; none
// given is kubeadm's default) and each kubeletExtraArgs entry, node-labels
// among them, as --kubelet-arg name=value, checked by
// kubeadm.CheckRegistration (NodeRestriction's label rules). Every other
// joinConfiguration field is refused, naming it: the bootstrapper makes the
// rest of the configuration from the join ticket and its own flags, so
// nothing of the spec is dropped silently. Errors wrap ErrAttestedSpec.
func nodeRegistrationArgs(join cabpkv1.JoinConfiguration) ([]string, error) {
	reg := join.NodeRegistration
	taints := ptr.Deref(reg.Taints, nil)
	if reg.Taints != nil && taints == nil {
		taints = []corev1.Taint{}
	}
	args := make([]kubeadm.KubeletArg, 0, len(reg.KubeletExtraArgs))
	for _, a := range reg.KubeletExtraArgs {
		args = append(args, kubeadm.KubeletArg{Name: a.Name, Value: ptr.Deref(a.Value, "")})
	}
	if fields := uncarriedJoinFields(join); len(fields) > 0 {
		return nil, fmt.Errorf("%w: %s not carried to the machine (the bootstrapper makes the join configuration; "+
			"only joinConfiguration.nodeRegistration.taints and .kubeletExtraArgs, node-labels among them, are carried): remove them",
			ErrAttestedSpec, strings.Join(fields, ", "))
	}
	if err := kubeadm.CheckRegistration(taints, args); err != nil {
		return nil, fmt.Errorf("%w: spec.joinConfiguration.nodeRegistration: %w", ErrAttestedSpec, err)
	}
	var out []string
	if reg.Taints != nil {
		out = append(out, "--node-taints", kubeadm.FormatTaints(taints))
	}
	for _, a := range args {
		out = append(out, "--kubelet-arg", a.Name+"="+a.Value)
	}
	return out, nil
}

// uncarriedJoinFields names the fields of join set beyond what attested
// mode carries (nodeRegistration's taints and kubeletExtraArgs).
func uncarriedJoinFields(join cabpkv1.JoinConfiguration) []string {
	join.NodeRegistration.Taints, join.NodeRegistration.KubeletExtraArgs = nil, nil
	return setFields("spec.joinConfiguration", join)
}

// setFields names the fields of v (a kubeadm configuration of the spec)
// that are set, under prefix: its top-level fields, and nodeRegistration's
// one by one.
func setFields(prefix string, v any) []string {
	b, err := json.Marshal(v)
	if err != nil {
		return []string{prefix + " (" + err.Error() + ")"}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return []string{prefix + " (" + err.Error() + ")"}
	}
	var fields []string
	for k, v := range m {
		var sub map[string]json.RawMessage
		if k == "nodeRegistration" && json.Unmarshal(v, &sub) == nil {
			for sk := range sub {
				fields = append(fields, prefix+".nodeRegistration."+sk)
			}
			continue
		}
		fields = append(fields, prefix+"."+k)
	}
	slices.Sort(fields)
	return fields
}

// uncarriedInitFields names what an attested init machine's spec sets of
// the kubeadm configuration: `gatehouse init` makes that machine's
// configuration, so none of it would reach the machine.
func uncarriedInitFields(spec *bootstrapv1.KubeadmConfigSpec) []string {
	return append(setFields("spec.clusterConfiguration", spec.ClusterConfiguration),
		setFields("spec.initConfiguration", spec.InitConfiguration)...)
}

// bootstrapperEnv is the environment file's content.
func bootstrapperEnv(in Input) (string, error) {
	args, err := bootstrapperArgs(in)
	if err != nil {
		return "", err
	}
	for _, a := range args {
		if !envSafe.MatchString(a) {
			// Unreachable after the checks above; kept so that a new flag
			// cannot bring an unchecked value.
			return "", fmt.Errorf("attested mode: bootstrapper argument %q is not safe in its environment file", a)
		}
	}
	return "GATEHOUSE_BOOTSTRAPPER_ARGS=\"" + strings.Join(args, " ") + "\"\n", nil
}
