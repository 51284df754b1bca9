// Package joinconfig parses and validates the join service's policy
// ConfigMaps: the join config (appraisal policy, measurement salt, API server
// endpoint, Kubernetes version and components) and the deny list.
package joinconfig

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// Keys of the join config ConfigMap (docs/joinservice.md shows an example).
const (
	// KeyAttestation holds the appraisal policy, YAML (policy.Policy).
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
	// KeyContinuousAttestation optionally holds what continuous
	// attestation does about a node that stops proving itself, as YAML
	// (ContinuousAttestation; docs/continuous-attestation.md).
	KeyContinuousAttestation = "continuousAttestation"
	// KeyImageMirror optionally holds the registry joiners' containerd
	// pulls every image from, gatehouse.components.v1.ImageMirror in
	// protobuf JSON form (the cluster configuration's mirror.registry;
	// docs/install-airgapped.md).
	KeyImageMirror = "imageMirror"
)

// ContinuousAttestation is what continuous attestation does about a node
// that fails (docs/continuous-attestation.md, "Action on failure").
type ContinuousAttestation struct {
	// Action is "taint" (the default: the node gets the
	// gatehouse.dev/unattested:NoExecute taint, so its pods move) or
	// "none" (the condition only).
	Action string `json:"action,omitempty"`
	// Restore is "automatic" (the default: a node that proves itself again
	// loses the taint) or "admin" (an administrator removes it).
	Restore string `json:"restore,omitempty"`
	// UnreachableGrace is how long a node may not answer before it is
	// acted on (default 5m): a reboot is not a compromise.
	UnreachableGrace metav1.Duration `json:"unreachableGrace,omitzero"`
}

// Values of ContinuousAttestation.
const (
	ActionTaint             = "taint"
	actionNone              = "none"
	RestoreAuto             = "automatic"
	RestoreAdmin            = "admin"
	defaultUnreachableGrace = 5 * time.Minute
)

// NodeNames are the names and addresses a node at addr owns under this
// config, the only ones its kubelet serving certificate may carry: addr
// (the address it joined from, or answered evidence at), NodeCIDRs,
// NodeDNSSuffixes, and never the API server endpoint's host.
func (c *JoinConfig) NodeNames(addr netip.Addr) clusterpki.NodeNames {
	names := clusterpki.NodeNames{CIDRs: c.NodeCIDRs, DNSSuffixes: c.NodeDNSSuffixes}
	if addr.IsValid() {
		names.Addresses = []netip.Addr{addr}
	}
	if host, _, err := net.SplitHostPort(c.APIServerEndpoint); err == nil {
		names.Reserved = []string{host}
	}
	return names
}

// parseContinuousAttestation parses the key's YAML strictly, with defaults.
func parseContinuousAttestation(data string) (ContinuousAttestation, error) {
	c := ContinuousAttestation{}
	if strings.TrimSpace(data) != "" {
		if err := yaml.UnmarshalStrict([]byte(data), &c); err != nil {
			return c, err
		}
	}
	if c.Action == "" {
		c.Action = ActionTaint
	}
	if c.Restore == "" {
		c.Restore = RestoreAuto
	}
	if c.UnreachableGrace.Duration == 0 {
		c.UnreachableGrace.Duration = defaultUnreachableGrace
	}
	var errs []error
	if c.Action != ActionTaint && c.Action != actionNone {
		errs = append(errs, fmt.Errorf("action %q: use %s or %s", c.Action, ActionTaint, actionNone))
	}
	if c.Restore != RestoreAuto && c.Restore != RestoreAdmin {
		errs = append(errs, fmt.Errorf("restore %q: use %s or %s", c.Restore, RestoreAuto, RestoreAdmin))
	}
	if c.UnreachableGrace.Duration < 0 {
		errs = append(errs, fmt.Errorf("unreachableGrace %s is negative", c.UnreachableGrace.Duration))
	}
	return c, errors.Join(errs...)
}

// maxComponents bounds the component list of a join config.
const maxComponents = 64

// JoinConfig is one validated version of the join config ConfigMap.
type JoinConfig struct {
	// Appraisal appraises joiners' evidence and tells their roles.
	Appraisal *policy.Appraisal
	// policy is the attestation policy Appraisal was compiled from, and
	// now its clock: RunningAppraisal compiles it for running nodes.
	policy policy.Policy
	now    func() time.Time
	// MeasurementSalt is handed to every joiner, keys.MeasurementSaltSize bytes.
	MeasurementSalt []byte
	// APIServerEndpoint is where joiners reach the API server, host:port.
	APIServerEndpoint string
	// KubernetesVersion is the version the cluster runs.
	KubernetesVersion string
	// Components are what a node installs for KubernetesVersion.
	Components []*componentsv1.Component
	// ImageMirror is where joiners' containerd pulls images from; nil
	// leaves their containerd's configuration as it is.
	ImageMirror *componentsv1.ImageMirror
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
	// ContinuousAttestation is what continuous attestation does about a
	// node that fails; defaults when the key is absent.
	ContinuousAttestation ContinuousAttestation
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
	if cfg.policy, err = parseAttestationPolicy([]byte(data[KeyAttestation]), variant); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyAttestation, err)
	}
	cfg.now = now
	if cfg.Appraisal, err = cfg.policy.Appraisal(now, nil); err != nil {
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
	if cfg.ImageMirror, err = mirror.ParseImageMirror(data[KeyImageMirror]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyImageMirror, err)
	}
	if cfg.NodeCIDRs, err = parseNodeCIDRs(data[KeyNodeCIDRs]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyNodeCIDRs, err)
	}
	if cfg.NodeDNSSuffixes, err = parseDNSSuffixes(data[KeyNodeDNSSuffixes]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyNodeDNSSuffixes, err)
	}
	if cfg.ContinuousAttestation, err = parseContinuousAttestation(data[KeyContinuousAttestation]); err != nil {
		return nil, fmt.Errorf("join config: %s: %w", KeyContinuousAttestation, err)
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
		if err := components.Validate(c); err != nil {
			return nil, fmt.Errorf("component %d: %w", i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

func parseAttestationPolicy(data []byte, variant attestation.Variant) (policy.Policy, error) {
	p, err := policy.Decode(data)
	if err != nil {
		return policy.Policy{}, err
	}
	if p.Variant != string(variant) {
		return policy.Policy{}, fmt.Errorf("variant %q differs from the service's variant %q", p.Variant, variant)
	}
	return p, nil
}

// RunningAppraisal compiles the same attestation policy for nodes that
// run in the cluster: their node-lock PCR must hold lockPCR
// (keys.ExpectedNodeLockPCR of the cluster ID) instead of zero. Continuous
// attestation verifies running nodes with it.
func (c *JoinConfig) RunningAppraisal(lockPCR []byte) (*policy.Appraisal, error) {
	if len(lockPCR) == 0 {
		return nil, errors.New("a running node's appraisal needs the node-lock PCR value")
	}
	return c.policy.Appraisal(c.now, lockPCR)
}
