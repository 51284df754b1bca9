package cloudmeta

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// dns1123Label is one label of a DNS-1123 subdomain (Kubernetes'
// IsDNS1123Subdomain: lower-case alphanumerics and '-', starting and
// ending alphanumeric).
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkNodeName checks that name can be a Kubernetes node name: a DNS-1123
// subdomain of at most 253 bytes.
func checkNodeName(name string) error {
	if name == "" {
		return errors.New("the node name is empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("the node name has %d bytes, at most 253", len(name))
	}
	for _, l := range strings.Split(name, ".") {
		if !dns1123Label.MatchString(l) {
			return fmt.Errorf("the node name %q is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')", name)
		}
	}
	return nil
}

// parseIPv4 checks that s is a unicast IPv4 address in dotted-quad form.
func parseIPv4(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return "", fmt.Errorf("%q is not an IPv4 address", s)
	}
	if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "", fmt.Errorf("%q is not a unicast address", s)
	}
	return a.String(), nil
}

// zonePattern and regionPattern are what a zone or region name may hold on
// any of the three clouds: lower-case letters, digits and '-'.
var zonePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`)

// checkZone checks a zone or region name (what names it in errors).
func checkZone(what, s string) error {
	if s == "" {
		return fmt.Errorf("the %s is empty", what)
	}
	if !zonePattern.MatchString(s) {
		return fmt.Errorf("the %s %q is not lower-case letters, digits and '-'", what, s)
	}
	return nil
}

// parseEndpoints parses a comma-separated list of host:port endpoints, as
// ControlPlanes reads it: blanks around entries are trimmed, empty entries
// skipped; a host is an IP address or a DNS name, a port 1-65535. The
// list must name at least one endpoint.
func parseEndpoints(s string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		host, port, err := net.SplitHostPort(e)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q is not host:port", e)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 || strconv.FormatUint(p, 10) != port {
			return nil, fmt.Errorf("endpoint %q: port %q is not 1-65535", e, port)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
				return nil, fmt.Errorf("endpoint %q: %q is not a unicast address", e, host)
			}
		} else if checkDNSName(host) != nil {
			return nil, fmt.Errorf("endpoint %q: host %q is neither an IP address nor a DNS name", e, host)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, errors.New("the endpoint list is empty")
	}
	return out, nil
}

// checkDNSName checks a host name: DNS-1123 labels, case-insensitively.
func checkDNSName(host string) error {
	return checkNodeName(strings.ToLower(strings.TrimSuffix(host, ".")))
}

// bcryptHash is the modular crypt format of bcrypt: $2a$, $2b$ or $2y$, a
// two-digit cost of 4-31, then 22 characters of salt and 31 of hash in
// bcrypt's base64 alphabet (./A-Za-z0-9), 60 bytes in all.
var bcryptHash = regexp.MustCompile(`^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$`)

// checkBcryptHash checks that s is a bcrypt hash, without echoing it.
func checkBcryptHash(s string) error {
	if !bcryptHash.MatchString(s) {
		return fmt.Errorf("the value (%d bytes) is not a bcrypt hash ($2a$, $2b$ or $2y$, cost 04-31, 60 bytes)", len(s))
	}
	return nil
}
