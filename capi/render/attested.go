package render

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Attested mode: the data only configures gatehouse-bootstrapper through
// BootstrapperEnvPath, a systemd EnvironmentFile whose
// GATEHOUSE_BOOTSTRAPPER_ARGS the image's unit expands, split at
// whitespace, into the bootstrapper's flags (config/systemd). Every value
// is validated before it is written, and what reaches the file is drawn
// from a character set that needs no quoting for systemd or for the flag
// parser: a value cannot end the line, the quotes or a flag.

// MaxAttestedDataSize is what attested-mode data of a joining worker
// stays within, raw, in both formats: far below the smallest common cloud
// user-data limit, so user data never needs a bucket in attested mode.
const MaxAttestedDataSize = 2 << 10

// dnsName is an RFC 1123 host name: labels of letters, digits and inner
// hyphens.
var dnsName = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

// caHash is kubeadm's discovery token CA cert hash.
var caHash = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// envSafe is what an argument written into the environment file may hold.
var envSafe = regexp.MustCompile(`^[A-Za-z0-9._:,/\[\]-]+$`)

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
	args := []string{"--success-file", SentinelPath}
	if in.Role == RoleInit {
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
	return args, nil
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
			return "", fmt.Errorf("attested mode: bootstrapper argument %q is not safe in %s", a, BootstrapperEnvPath)
		}
	}
	return "GATEHOUSE_BOOTSTRAPPER_ARGS=\"" + strings.Join(args, " ") + "\"\n", nil
}
