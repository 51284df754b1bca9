// Package joinconfig parses and validates the join service's policy
// ConfigMaps: the join config (appraisal policy, measurement salt, API server
// endpoint, Kubernetes version and components) and the deny list.
package joinconfig

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/installer"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// Keys of the join config ConfigMap (docs/joinservice.md shows an example).
const (
	// KeyAttestation holds the appraisal policy, YAML (AttestationPolicy).
	KeyAttestation = "attestation.yaml"
	// KeyMeasurementSalt holds the 32-byte measurement salt, hex.
	KeyMeasurementSalt = "measurementSalt"
	// KeyAPIServerEndpoint holds the API server endpoint joiners use, host:port.
	KeyAPIServerEndpoint = "apiServerEndpoint"
	// KeyKubernetesVersion holds the cluster's Kubernetes version, "v1.36.4".
	KeyKubernetesVersion = "kubernetesVersion"
	// KeyKubernetesComponents holds the version's components, a JSON array
	// of gatehouse.components.v1.Component in protobuf JSON form.
	KeyKubernetesComponents = "kubernetesComponents"
	// KeyNodeCIDRs optionally holds CIDRs, separated by commas or
	// whitespace, whose addresses nodes may name in their kubelet
	// certificates besides their own source address.
	KeyNodeCIDRs = "nodeCIDRs"
	// KeyNodeDNSSuffixes optionally holds DNS suffixes, separated by commas
	// or whitespace: a node may name itself <node name>.<suffix>.
	KeyNodeDNSSuffixes = "nodeDNSSuffixes"
)

// KeyDenyList is the key of the deny list ConfigMap: one entry per line,
// '#' starts a comment. An entry is an attestation identity
// (attestation.Result.Identity: "tpm-ak:sha256:<hex>",
// "sev-snp-chip:<hex>", "tdx-ppid:<hex>") or "node:<node name>".
const KeyDenyList = "denied"

// maxComponents bounds the component list of a join config.
const maxComponents = 64

// AttestationPolicy is the file form of the appraisal policy in the join
// config (key attestation.yaml).
type AttestationPolicy struct {
	// Variant must be the variant the service was started for ("tpm").
	Variant string `json:"variant"`
	// PCRs is the SHA-256 PCR selection every quote must cover; it must
	// include keys.NodeLockPCR.
	PCRs []int `json:"pcrs"`
	// ReferenceValues are the expected PCR values every node shares, whatever
	// its role (package measurements' format). keys.NodeLockPCR must not appear:
	// it is always enforced as zero.
	ReferenceValues json.RawMessage `json:"referenceValues,omitempty"`
	// Roles holds the reference values of each node role a node can prove
	// (RoleControlPlane, RoleWorker). A node's evidence must satisfy
	// ReferenceValues and at least one role's; the roles it satisfies are
	// the only ones it gets (docs/joinservice.md, "Roles from evidence").
	Roles map[Role]RolePolicy `json:"roles"`
	// AKRoots is a PEM bundle of roots for AK certificate chains.
	AKRoots string `json:"akRoots,omitempty"`
	// PinnedAKs are PEM public keys of trusted attestation keys.
	PinnedAKs []string `json:"pinnedAKs,omitempty"`
}

// JoinConfig is one validated version of the join config ConfigMap.
type JoinConfig struct {
	// Appraisal appraises joiners' evidence and tells their roles.
	Appraisal *Appraisal
	// MeasurementSalt is handed to every joiner, keys.MeasurementSaltSize bytes.
	MeasurementSalt []byte
	// APIServerEndpoint is where joiners reach the API server, host:port.
	APIServerEndpoint string
	// KubernetesVersion is the version the cluster runs.
	KubernetesVersion string
	// Components are what a node installs for KubernetesVersion.
	Components []*componentsv1.Component
	// Summary describes the config for logs: variant, PCRs, a digest of the
	// reference values.
	Summary string
	// NodeCIDRs are address ranges whose addresses a node may put in its
	// kubelet certificate besides its connection's source address (nodes
	// behind NAT, or with several interfaces). Optional.
	NodeCIDRs []netip.Prefix
	// NodeDNSSuffixes are domains under which a node may name itself in its
	// kubelet certificate (<node>.<suffix>) besides its bare node name.
	// Optional.
	NodeDNSSuffixes []string
}

// ParseJoinConfig validates the data of the join config ConfigMap for the
// service's attestation variant. now is the clock AK certificates are
// checked with. Errors name the key and what is wrong with it.
func ParseJoinConfig(data map[string]string, variant attestation.Variant, now func() time.Time) (*JoinConfig, error) {
	cfg := &JoinConfig{}
	for _, key := range []string{KeyAttestation, KeyMeasurementSalt, KeyAPIServerEndpoint, KeyKubernetesVersion, KeyKubernetesComponents} {
		if strings.TrimSpace(data[key]) == "" {
			return nil, fmt.Errorf("join config: key %q is missing or empty", key)
		}
	}
	var err error
	if cfg.Appraisal, err = parseAttestationPolicy([]byte(data[KeyAttestation]), variant, now); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyAttestation, err)
	}
	cfg.Summary = cfg.Appraisal.Summary
	salt, err := hex.DecodeString(strings.TrimSpace(data[KeyMeasurementSalt]))
	if err != nil || len(salt) != keys.MeasurementSaltSize {
		return nil, fmt.Errorf("join config: %s must be %d bytes as hex (%d hex digits)", KeyMeasurementSalt, keys.MeasurementSaltSize, 2*keys.MeasurementSaltSize)
	}
	cfg.MeasurementSalt = salt
	endpoint := strings.TrimSpace(data[KeyAPIServerEndpoint])
	if host, port, err := net.SplitHostPort(endpoint); err != nil || host == "" || !validPort(port) {
		return nil, fmt.Errorf("join config: %s %q is not host:port", KeyAPIServerEndpoint, endpoint)
	}
	cfg.APIServerEndpoint = endpoint
	cfg.KubernetesVersion = strings.TrimSpace(data[KeyKubernetesVersion])
	if !validKubernetesVersion(cfg.KubernetesVersion) {
		return nil, fmt.Errorf("join config: %s %q is not a release version like v1.36.4", KeyKubernetesVersion, cfg.KubernetesVersion)
	}
	if cfg.Components, err = parseComponents([]byte(data[KeyKubernetesComponents])); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyKubernetesComponents, err)
	}
	if cfg.NodeCIDRs, err = parseNodeCIDRs(data[KeyNodeCIDRs]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyNodeCIDRs, err)
	}
	if cfg.NodeDNSSuffixes, err = parseDNSSuffixes(data[KeyNodeDNSSuffixes]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyNodeDNSSuffixes, err)
	}
	return cfg, nil
}

// maxNodeNetworks bounds the node CIDRs and DNS suffixes of a join config.
const maxNodeNetworks = 64

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' })
}

func parseNodeCIDRs(s string) ([]netip.Prefix, error) {
	fields := splitList(s)
	if len(fields) > maxNodeNetworks {
		return nil, fmt.Errorf("has %d CIDRs; at most %d are allowed", len(fields), maxNodeNetworks)
	}
	var out []netip.Prefix
	for _, f := range fields {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/16", f)
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%q covers every address; name the nodes' networks", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func parseDNSSuffixes(s string) ([]string, error) {
	fields := splitList(s)
	if len(fields) > maxNodeNetworks {
		return nil, fmt.Errorf("has %d suffixes; at most %d are allowed", len(fields), maxNodeNetworks)
	}
	var out []string
	for _, f := range fields {
		f = strings.TrimPrefix(f, ".")
		if errs := validation.IsDNS1123Subdomain(f); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a DNS suffix: %s", f, strings.Join(errs, "; "))
		}
		out = append(out, f)
	}
	return out, nil
}

func validPort(s string) bool {
	p, err := strconv.Atoi(s)
	return err == nil && p > 0 && p < 65536
}

func validKubernetesVersion(v string) bool {
	parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
	if !strings.HasPrefix(v, "v") || len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if n, err := strconv.Atoi(p); err != nil || n < 0 || strconv.Itoa(n) != p {
			return false
		}
	}
	return true
}

func parseComponents(data []byte) ([]*componentsv1.Component, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON array: %w", err)
	}
	if len(raw) == 0 || len(raw) > maxComponents {
		return nil, fmt.Errorf("has %d components; 1 to %d are allowed", len(raw), maxComponents)
	}
	out := make([]*componentsv1.Component, 0, len(raw))
	for i, r := range raw {
		c := &componentsv1.Component{}
		if err := protojson.Unmarshal(r, c); err != nil {
			return nil, fmt.Errorf("component %d: %w", i, err)
		}
		// What the node's installer accepts: https, http, file or data URLs
		// (the pinned digest makes the transport's integrity irrelevant).
		if err := installer.Validate(c); err != nil {
			return nil, fmt.Errorf("component %d: %w", i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

func parseAttestationPolicy(data []byte, variant attestation.Variant, now func() time.Time) (*Appraisal, error) {
	p, err := DecodeAttestationPolicy(data)
	if err != nil {
		return nil, err
	}
	if p.Variant != string(variant) {
		return nil, fmt.Errorf("variant %q differs from the service's variant %q", p.Variant, variant)
	}
	return p.Appraisal(now, nil)
}

// DecodeAttestationPolicy decodes YAML (or JSON) strictly: unknown fields
// are errors.
func DecodeAttestationPolicy(data []byte) (AttestationPolicy, error) {
	var p AttestationPolicy
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return p, err
	}
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	err = dec.Decode(&p)
	return p, err
}

// Verifier returns the verifier of p, accepting evidence that satisfies
// any of its roles, and a summary of it for logs. lockPCR is what the
// node-lock PCR must hold (see Appraisal).
func (p AttestationPolicy) Verifier(now func() time.Time, lockPCR []byte) (attestation.Verifier, string, error) {
	a, err := p.Appraisal(now, lockPCR)
	if err != nil {
		return nil, "", err
	}
	return a, a.Summary, nil
}

func parseEndorsement(p AttestationPolicy) (tpm.Endorsement, error) {
	var e tpm.Endorsement
	if (strings.TrimSpace(p.AKRoots) == "") == (len(p.PinnedAKs) == 0) {
		return e, errors.New("set exactly one of akRoots and pinnedAKs")
	}
	if p.AKRoots != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(p.AKRoots)) {
			return e, errors.New("akRoots holds no PEM certificate")
		}
		e.Roots = pool
		return e, nil
	}
	for i, s := range p.PinnedAKs {
		block, _ := pem.Decode([]byte(s))
		if block == nil || block.Type != "PUBLIC KEY" {
			return e, fmt.Errorf("pinnedAKs[%d] is not a PEM PUBLIC KEY", i)
		}
		pub, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return e, fmt.Errorf("pinnedAKs[%d]: %w", i, err)
		}
		e.PinnedKeys = append(e.PinnedKeys, crypto.PublicKey(pub))
	}
	return e, nil
}

// DenyList is a parsed deny list: attestation identities and node names
// refused on every request.
type DenyList struct {
	identities map[string]bool
	nodes      map[string]bool
}

// denyPrefixes are the entry forms of a deny list.
var denyPrefixes = []string{"tpm-ak:sha256:", "sev-snp-chip:", "tdx-ppid:", "node:"}

// ParseDenyList parses the deny list format (see KeyDenyList). An entry of
// an unknown form is an error naming its line.
func ParseDenyList(text string) (DenyList, error) {
	d := DenyList{identities: map[string]bool{}, nodes: map[string]bool{}}
	for i, line := range strings.Split(text, "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !slices.ContainsFunc(denyPrefixes, func(p string) bool { return strings.HasPrefix(line, p) && len(line) > len(p) }) {
			return DenyList{}, fmt.Errorf("deny list line %d: %q is not one of %s followed by a value", i+1, line, strings.Join(denyPrefixes, ", "))
		}
		if node, ok := strings.CutPrefix(line, "node:"); ok {
			d.nodes[node] = true
		} else {
			d.identities[line] = true
		}
	}
	return d, nil
}

// Denies returns the entry that refuses identity or nodeName ("" for a
// request without a node name), if any.
func (d DenyList) Denies(identity, nodeName string) (string, bool) {
	if d.identities[identity] {
		return identity, true
	}
	if nodeName != "" && d.nodes[nodeName] {
		return "node:" + nodeName, true
	}
	return "", false
}

// Len returns the number of entries.
func (d DenyList) Len() int { return len(d.identities) + len(d.nodes) }

// Fingerprint returns "sha256:" and the first 16 hex digits of data's
// SHA-256, a short fingerprint for logs.
func Fingerprint(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
