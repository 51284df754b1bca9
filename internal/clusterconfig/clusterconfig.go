// Package clusterconfig is the cluster configuration file the CLI reads
// (gatehouse-config.yaml): cluster name, Kubernetes version, attestation
// policy (variant, PCRs, reference values, trusted attestation keys) and
// networking. `gatehouse config generate` writes a commented one.
package clusterconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// DefaultPath is the configuration file's default name.
const DefaultPath = "gatehouse-config.yaml"

// Config is the cluster configuration.
type Config struct {
	// Name is the cluster name, a DNS-1123 label.
	Name string `json:"name"`
	// KubernetesVersion is 1.MINOR or v1.MINOR.PATCH, resolved with
	// package versions.
	KubernetesVersion string `json:"kubernetesVersion"`
	// Attestation is the appraisal policy of the cluster's nodes, in the
	// join service's format (docs/joinservice.md).
	Attestation policy.Policy `json:"attestation"`
	// Networking holds the cluster's CIDRs.
	Networking Networking `json:"networking"`
	// APIServerCertSANs are extra API server certificate names.
	APIServerCertSANs []string `json:"apiServerCertSANs,omitempty"`
	// ControlPlaneEndpoint is the stable host:port of the API servers, a
	// load balancer in front of every control plane (kubeadm's
	// controlPlaneEndpoint, docs/quickstart.md "High availability"). Empty
	// means the first control plane's address: that cluster cannot add
	// control planes later.
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint,omitempty"`
	// KubeletCertificateLifetime is how long kubelet client and serving
	// certificates are valid (kubelets renew them at 70-90 % of it, and
	// Gatehouse approves a renewal only after the node's fresh evidence
	// verifies: docs/continuous-attestation.md). Zero means
	// kubeadm.DefaultKubeletCertLifetime (24 h); at least
	// kubeadm.MinKubeletCertLifetime, at most a year.
	KubeletCertificateLifetime metav1.Duration `json:"kubeletCertificateLifetime,omitempty"`
	// MasterSecretKEK names a key-encryption key in an external KMS
	// (kms://aws-kms?key-id=…&region=… or
	// kms://vault-transit?address=…&key=…&token-source=file:…,
	// docs/keys.md "External KMS"): `gatehouse init` wraps the new master
	// secret with it and stores only the wrapped form. Empty: the master
	// secret file holds it in plain.
	MasterSecretKEK string `json:"masterSecretKEK,omitempty"`
	// Mirror, when set, names the mirror the operator runs for installs
	// without internet (docs/install-airgapped.md): every Kubernetes
	// component nodes download comes from its file server, and the
	// control plane's images from its registry, with the same sha256
	// checks. Nil: the official downloads.
	Mirror *mirror.Mirror `json:"mirror,omitempty"`
}

// Components returns the components nodes of arch (amd64 or arm64)
// install: the configured release's from the versions table, with their
// URLs mapped to the mirror when one is set.
func (c *Config) Components(arch string) ([]*componentsv1.Component, error) {
	release, err := c.Release()
	if err != nil {
		return nil, err
	}
	list, err := release.Proto(arch)
	if err != nil {
		return nil, err
	}
	return c.Mirror.Components(list)
}

// KubeletCertLifetime is c.KubeletCertificateLifetime, or the default when
// unset.
func (c *Config) KubeletCertLifetime() time.Duration {
	if c.KubeletCertificateLifetime.Duration == 0 {
		return kubeadm.DefaultKubeletCertLifetime
	}
	return c.KubeletCertificateLifetime.Duration
}

// Networking holds the cluster's CIDRs.
type Networking struct {
	ServiceCIDR string `json:"serviceCIDR"`
	PodCIDR     string `json:"podCIDR"`
}

// Load reads and validates the configuration at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster configuration: %w", err)
	}
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parse decodes YAML strictly and validates it. Errors name every field
// that is wrong.
func parse(data []byte) (*Config, error) {
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	return &c, c.Validate()
}

// Validate checks every field.
func (c *Config) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(c.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("name %q: %v", c.Name, msgs))
	}
	if _, err := versions.Resolve(c.KubernetesVersion); err != nil {
		errs = append(errs, fmt.Errorf("kubernetesVersion: %w", err))
	}
	if _, err := c.Verifier(nil); err != nil {
		errs = append(errs, fmt.Errorf("attestation: %w", err))
	} else if ref, err := measurements.Parse(c.Attestation.ReferenceValues, 32); (err != nil || len(ref) == 0) && !c.Attestation.HasAlternatives() {
		// Shared values may be empty only where nodes of two kinds share
		// none (a local cluster's namespace and VM nodes): every role's
		// sets are non-empty, so every node is still held to one.
		errs = append(errs, errors.New("attestation.referenceValues is empty: a policy without reference values accepts any software"))
	}
	prefixes := map[string]netip.Prefix{}
	for name, s := range map[string]string{"networking.serviceCIDR": c.Networking.ServiceCIDR, "networking.podCIDR": c.Networking.PodCIDR} {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q is not a CIDR such as 10.96.0.0/12", name, s))
			continue
		}
		prefixes[name] = p
	}
	if s, p := prefixes["networking.serviceCIDR"], prefixes["networking.podCIDR"]; s.IsValid() && p.IsValid() && s.Overlaps(p) {
		errs = append(errs, fmt.Errorf("networking.serviceCIDR %s and networking.podCIDR %s overlap", s, p))
	}
	for _, san := range c.APIServerCertSANs {
		if _, err := netip.ParseAddr(san); err != nil && len(validation.IsDNS1123Subdomain(san)) > 0 {
			errs = append(errs, fmt.Errorf("apiServerCertSANs: %q is neither an IP address nor a DNS name", san))
		}
	}
	if c.ControlPlaneEndpoint != "" {
		if err := checkHostPort(c.ControlPlaneEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("controlPlaneEndpoint: %w", err))
		}
	}
	if err := kubeadm.CheckKubeletCertLifetime(c.KubeletCertLifetime()); err != nil {
		errs = append(errs, fmt.Errorf("kubeletCertificateLifetime: %w", err))
	}
	if c.MasterSecretKEK != "" {
		if err := checkKEK(c.MasterSecretKEK); err != nil {
			errs = append(errs, fmt.Errorf("masterSecretKEK: %w", err))
		}
	}
	if err := c.Mirror.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("mirror: %w", err))
	}
	return errors.Join(errs...)
}

// checkHostPort checks that s is host:port with an IP address or DNS name
// and a port in 1..65535.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port such as 192.0.2.5:6443", s)
	}
	if _, err := netip.ParseAddr(host); err != nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return fmt.Errorf("%q: host %q is neither an IP address nor a DNS name", s, host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number in 1..65535", s, port)
	}
	return nil
}

// Verifier returns the verifier of the nodes' evidence, accepting any role
// of the policy. lockPCR is what PCR 15 must hold: nil for a node before
// init or join (zero), the value its cluster ID extended into it for a
// running node.
func (c *Config) Verifier(lockPCR []byte) (attestation.Verifier, error) {
	return c.Appraisal(lockPCR)
}

// Appraisal returns the compiled attestation policy (see Verifier), which
// also tells a node's roles and verifies one role only.
func (c *Config) Appraisal(lockPCR []byte) (*policy.Appraisal, error) {
	return c.Attestation.Appraisal(time.Now, lockPCR)
}

// Release returns the Kubernetes release of the configuration.
func (c *Config) Release() (versions.Release, error) { return versions.Resolve(c.KubernetesVersion) }

// TemplateValues fill the commented configuration Generate writes.
type TemplateValues struct {
	Name              string
	KubernetesVersion string
	// ReferenceValues is the JSON of the expected PCR values every node
	// shares (package measurements' format), e.g. computed from what the
	// nodes boot.
	ReferenceValues string
	// RoleReferenceValues holds, per role, the JSON of the PCR values that
	// prove it (docs/joinservice.md, "Roles from evidence"). The control
	// plane's is required: the first node is one.
	RoleReferenceValues map[policy.Role]string
	// RoleAlsoAccepted holds, per role, the JSON of further sets of PCR
	// values that prove it (roles.<role>.alsoAccepted: a second kind of
	// node, e.g. the local cluster's VM nodes of the node image).
	RoleAlsoAccepted map[policy.Role][]string
	// RequireEventLog, when set, is attestation.requireEventLog.
	RequireEventLog *bool
	// PCRs is the quoted selection; it must include 15.
	PCRs []int
	// PinnedAKs are PEM public keys of trusted attestation keys; or else
	// EKRoots (and EKIntermediates) are PEM bundles of the TPM manufacturers'
	// CAs whose TPMs are trusted (docs/attestation.md, "Endorsed keys").
	PinnedAKs                []string
	EKRoots, EKIntermediates string
	// GCEProjects (and GCEZones), when set, trust the Compute Engine vTPMs
	// of those projects instead (docs/attestation.md, "Cloud vTPMs").
	GCEProjects, GCEZones []string
	// Variant is the attestation variant: "" or tpm, sev-snp, azure-sev-snp
	// or tdx.
	Variant string
	// LaunchMeasurements (hex) and MinimumTCB fill the sevSnp section
	// (variants sev-snp and azure-sev-snp).
	LaunchMeasurements []string
	MinimumTCB         choose.SNPTCB
	// MRTD (hex) fills tdx's section.
	MRTD string
	// CollateralCache is where sev-snp and tdx verifiers cache AMD KDS or
	// Intel PCS collateral.
	CollateralCache      string
	ServiceCIDR, PodCIDR string
	// ControlPlaneEndpoint, when set, is the load balancer's host:port.
	ControlPlaneEndpoint string
	// KubeletCertLifetime, when set, is kubeletCertificateLifetime.
	KubeletCertLifetime time.Duration
	// Mirror, when set, is the mirror section; else it is written
	// commented out.
	Mirror *mirror.Mirror
}

var configTemplate = template.Must(template.New("config").Funcs(template.FuncMap{
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"supported": func() string { return fmt.Sprint(versions.Supported()) },
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n"+pad)
	},
}).Parse(`# Gatehouse cluster configuration (docs/quickstart.md).
# Every field is checked when a command reads this file.

# Cluster name: a DNS-1123 label (lowercase letters, digits, '-').
name: {{.Name}}

# Kubernetes version: 1.MINOR picks that minor's supported patch release.
# Supported: {{supported}}
kubernetesVersion: {{.KubernetesVersion}}

# How nodes prove what they run (remote attestation, IETF RATS terms).
attestation:
  # Attestation variant (docs/attestation.md, "Variants"):
  #   tpm      a TPM 2.0 quote; its attestation key is trusted as set below
  #            (TPM manufacturers, Compute Engine vTPMs, or registered keys);
  #   sev-snp  an AMD SEV-SNP confidential VM: its vTPM's quote, and the SEV-SNP
  #            report binding the vTPM's key (section sevSnp);
  #   tdx      an Intel TDX confidential VM: its vTPM's quote, and the TDX quote
  #            binding the vTPM's key (section tdx);
  #   azure-sev-snp  an Azure confidential VM on SEV-SNP: its paravisor vTPM's
  #            quote, and the HCL report binding that vTPM's key (section sevSnp:
  #            the paravisor's launch measurements).
  variant: {{.Variant}}
  # SHA-256 PCRs every (v)TPM quote must cover. 15 is the node lock: it must be
  # zero when a node asks for keys, and holds the cluster ID afterwards.
  pcrs: {{json .PCRs}}
  # Reference values every node shares: per PCR the expected value (hex) and
  # whether a mismatch only warns. Never list PCR 15 here.
  referenceValues: {{.ReferenceValues}}
  # Reference values per node role. A node gets a role only when its evidence
  # satisfies that role's values too: the role is part of what it measures at
  # boot (a role image, or the role on the measured kernel command line). The
  # control plane's values must differ from every other role's at some PCR
  # (docs/joinservice.md, "Roles from evidence").
  roles:
{{- range $role, $values := .RoleReferenceValues}}
    {{$role}}:
      referenceValues: {{$values}}
{{- with index $.RoleAlsoAccepted $role}}
      alsoAccepted:
{{- range .}}
      - {{.}}
{{- end}}
{{- end}}
{{- end}}
{{- with .RequireEventLog}}
  # Whether a quote must come with the node's TCG event log (docs/attestation.md,
  # "Event logs"); a log that comes is replayed either way.
  requireEventLog: {{.}}
{{- end}}
{{- if or (eq .Variant "sev-snp") (eq .Variant "azure-sev-snp")}}
  # What every node's SEV-SNP report must show. The report binds the vTPM's key,
  # so no key is registered and no key trust field is set.
  sevSnp:
    # Accepted launch measurements (hex, 48 bytes), one per image version
    # (gatehouse reference-values capture, or the image build's output).
    launchMeasurements: {{json .LaunchMeasurements}}
    # Lowest acceptable TCB (AMD security bulletins name the fixed versions).
    minimumTCB: {bootloader: {{.MinimumTCB.Bootloader}}, tee: {{.MinimumTCB.TEE}}, snp: {{.MinimumTCB.SNP}}, microcode: {{.MinimumTCB.Microcode}}}
    # Debugging is always refused. Optional, with their meaning:
    # minimumLaunchTCB: {...}       # lowest LAUNCH_TCB (default: minimumTCB)
    # guestPolicy: {smt: true, migrationAgent: false, minimumABI: "1.55"}
    # vmpl: 0                       # the VM privilege level reports come from
    # idKeyDigests: [<hex SHA-384>] # require an ID block signed by these keys
    # authorKeyDigests: [<hex>]
    # roots: [<PEM>]                # only for test or air-gapped copies of AMD's roots
    # VCEKs and CRLs from AMD's Key Distribution Service, cached here; with
    # offline: true only the cache serves (fill it online once).
    collateral: {cacheDir: {{json .CollateralCache}}, checkRevocations: true}
{{- else if eq .Variant "tdx"}}
  # What every node's TDX quote must show. The quote binds the vTPM's key, so
  # no key is registered and no key trust field is set.
  tdx:
    # The TD's initial measurement (hex, 48 bytes).
    mrtd: {{json .MRTD}}
    # A debuggable TD is always refused. Optional, with their meaning:
    # rtmrs: {0: <hex>, ...}        # runtime measurement registers 0-3
    # mrSeam: <hex>                 # the TDX module; mrSignerSeam: its signer
    # tdAttributes: <hex, 8 bytes>  # exact TD_ATTRIBUTES; xfam: exact XFAM
    # minimumTeeTcbSvn: <hex, 16 bytes>
    # minimumQeSvn: 8, minimumPceSvn: 13, qeVendorID: 939a7233f79c4ca9940a0db3957f0607
    # roots: <PEM>                  # only for test hierarchies
    # TCB info, QE identity and CRLs from Intel's Provisioning Certification
    # Service, cached here; with offline: true only the cache serves.
    collateral: {cacheDir: {{json .CollateralCache}}, checkRevocations: true}
{{- else}}
  # How attestation keys are trusted; set exactly one of:
  #   ekRoots    TPM manufacturers' root CAs (PEM): any TPM they made joins, with
  #              no key registered; it proves its key by credential activation
  #              (ekIntermediates: their issuing CAs);
  #   pinnedAKs  registered attestation keys (PEM public keys);
  #   gce        Compute Engine vTPMs of the listed projects (and zones): their AK
  #              certificates from Google's vTPM CA name the instance;
  #   azureTrustedLaunch
  #              Azure Trusted Launch vTPMs: certificateIDs: [<id>] or anyVM: true
  #              (docs/attestation.md, "Cloud vTPMs: Azure Trusted Launch");
  #   awsNitroTPM
  #              AWS NitroTPM instances: the Nitro hypervisor's document names the
  #              AK and shows referenceValues (SHA-384); instanceIDs or anyInstance
  #              (docs/attestation.md, "Cloud vTPMs: AWS NitroTPM");
  #   akRoots    CAs (PEM) that attestation key certificates chain to.
{{- if .GCEProjects}}
  gce:
    projects: {{json .GCEProjects}}
{{- if .GCEZones}}
    zones: {{json .GCEZones}}
{{- end}}
{{- else if .EKRoots}}
  ekRoots: |
{{indent 4 .EKRoots}}
{{- if .EKIntermediates}}
  ekIntermediates: |
{{indent 4 .EKIntermediates}}
{{- end}}
{{- else}}
  pinnedAKs:
{{- range .PinnedAKs}}
    - {{json .}}
{{- else}} []
{{- end}}
{{- end}}
{{- end}}

networking:
  # Cluster IPs of Services.
  serviceCIDR: {{.ServiceCIDR}}
  # Pod addresses; must not overlap serviceCIDR.
  podCIDR: {{.PodCIDR}}

# Extra names (DNS names or IPs) for the API server's certificate.
apiServerCertSANs: []

# host:port of a load balancer in front of every control plane's API server,
# for more than one control plane. Empty: the first control plane's address,
# and no control plane can be added later.
controlPlaneEndpoint: {{json .ControlPlaneEndpoint}}

# Lifetime of kubelet client and serving certificates. Kubelets renew them at
# 70-90 % of it; Gatehouse approves a renewal only while the node's fresh
# evidence verifies, so a node that stops proving itself loses its credentials
# within this long (docs/continuous-attestation.md).
kubeletCertificateLifetime: {{if .KubeletCertLifetime}}{{.KubeletCertLifetime}}{{else}}24h{{end}}

# A key-encryption key in an external KMS that wraps the master secret, which
# is then stored only wrapped (docs/keys.md, "External KMS"), e.g.
#   kms://aws-kms?key-id=alias/gatehouse&region=eu-west-1
#   kms://vault-transit?address=https://vault.example:8200&key=gatehouse&token-source=file:/run/vault/token
# Empty: gatehouse init writes the master secret in plain to its file.
# masterSecretKEK: ""

# Installs without internet (docs/install-airgapped.md): a mirror you run.
# Every Kubernetes component nodes download comes from the file server at
#   <files>/<original host>/<original path>
# and every image the nodes pull (the control plane's, the pause image, the
# Gatehouse services', workloads' of registry.k8s.io and docker.io) from the
# registry at
#   <registry>/<original registry>/<repository>
# with the same pinned sha256 digests; a changed file is refused.
# gatehouse mirror list and gatehouse mirror sync fill such a mirror.
{{- with .Mirror}}
mirror:
{{- if .Files}}
  files: {{json .Files}}
{{- end}}
{{- if .Registry}}
  registry: {{json .Registry}}
{{- end}}
{{- if .PlainHTTP}}
  plainHTTP: true
{{- end}}
{{- else}}
# mirror:
#   files: https://mirror.example/files
#   registry: mirror.example:5000
#   plainHTTP: false   # true: the nodes' containerd speaks HTTP to the registry
{{- end}}
`))

// Generate renders a commented configuration from v and checks that it
// parses and validates.
func Generate(v TemplateValues) ([]byte, error) {
	if v.Variant == "" {
		v.Variant = "tpm"
	}
	var buf bytes.Buffer
	if err := configTemplate.Execute(&buf, v); err != nil {
		return nil, err
	}
	if _, err := parse(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("the generated configuration is invalid: %w", err)
	}
	return buf.Bytes(), nil
}

// checkKEK requires an external KMS URI naming a key without a wrapped
// secret.
func checkKEK(uri string) error {
	parsed, err := kms.ParseURI(uri)
	if err != nil {
		return err
	}
	w, ok := kms.External(parsed)
	switch {
	case !ok:
		return fmt.Errorf("give a key-encryption key of an external KMS: kms://%s?key-id=…&region=… or kms://%s?address=…&key=…&token-source=file:…", kms.BackendAWSKMS, kms.BackendVaultTransit)
	case w.IsWrapped():
		return errors.New("name only the key-encryption key, without wrapped and salt: gatehouse init wraps a new master secret")
	}
	return nil
}
