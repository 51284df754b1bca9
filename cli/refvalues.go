package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

func newReferenceValuesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reference-values",
		Short: "Get the reference values a policy expects, from golden nodes or boot event logs",
	}
	cmd.AddCommand(newReferenceValuesCaptureCmd())
	return cmd
}

// captured is one role's measurements and where they came from.
type captured struct {
	role       policy.Role
	values     map[uint32][]byte
	provenance string
	// hardware is, for sev-snp and tdx, the hardware report's result:
	// launch measurement (index 0) or MRTD and RTMRs (0-4).
	hardware *attestation.Result
}

func newReferenceValuesCaptureCmd() *cobra.Command {
	var (
		cpNode, workerNode, cpLog, workerLog, outDir string
		trust                                        policy.Policy
		ekRootsFile, ekInterFile, variant, hwRoots   string
		akFiles, gceProjects, gceZones               []string
		force, awsNitro                              bool
	)
	cmd := &cobra.Command{
		Use:   "capture",
		Short: "Capture reference values from a golden control plane and worker",
		Long: "Read the measurements of a golden node of each role, either as fresh evidence over\n" +
			"attested TLS from the node's evidence endpoint (its attestation key checked as a join\n" +
			"policy would: --ek-roots, --gce-project or --pinned-ak) or by replaying its boot event\n" +
			"log offline, and write the files `gatehouse config generate` takes: PCRs equal on both\n" +
			"roles go to reference-values.yaml, the others prove each role (control-plane.yaml,\n" +
			"worker.yaml). Each file says where its values came from. PCR 15 (the node lock) is\n" +
			"never captured. Capture from machines you trust to run exactly the software you mean\n" +
			"to admit (docs/attestation.md, \"Reference values\").\n\n" +
			"With --aws-nitro the golden nodes are EC2 instances with NitroTPM: their AKs are trusted by\n" +
			"the Nitro hypervisor's attestation documents, whose SHA-384 PCRs go to aws-nitrotpm.yaml,\n" +
			"the awsNitroTPM section to paste.\n\n" +
			"With --attestation sev-snp or tdx the golden nodes are confidential VMs: their hardware\n" +
			"report is checked against AMD's or Intel's roots, and the launch measurement or MRTD\n" +
			"and RTMRs go to sev-snp.yaml or tdx.yaml, the policy section to paste.",
		Example: "  gatehouse reference-values capture --control-plane 192.0.2.10:9001 --worker 192.0.2.11:9001 --ek-roots tpm-vendor-roots.pem\n" +
			"  gatehouse config generate --reference-values reference-values.yaml \\\n" +
			"    --control-plane-reference-values control-plane.yaml --worker-reference-values worker.yaml --ek-roots tpm-vendor-roots.pem",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (cpNode == "") == (cpLog == "") {
				return errors.New("give the golden control plane as exactly one of --control-plane (its evidence address) and --control-plane-event-log")
			}
			if workerNode != "" && workerLog != "" {
				return errors.New("give the golden worker as one of --worker and --worker-event-log, not both")
			}
			v, err := attestation.ParseVariant(variant)
			if err != nil {
				return fmt.Errorf("--attestation: %w", err)
			}
			trust.Variant = string(v)
			roots, err := readOptional("--hardware-roots", hwRoots)
			if err != nil {
				return err
			}
			switch {
			case v == attestation.VariantSNP || v == attestation.VariantAzureSNP:
				trust.SEVSNP = &choose.SEVSNPPolicy{}
				if roots != "" {
					trust.SEVSNP.Roots = []string{roots}
				}
			case v == attestation.VariantTDX:
				trust.TDX = &choose.TDXPolicy{Roots: roots}
			case roots != "":
				return errors.New("--hardware-roots is for --attestation sev-snp, azure-sev-snp or tdx")
			}
			if v != attestation.VariantTPM && (cpLog != "" || workerLog != "") {
				return fmt.Errorf("--attestation %s captures from golden nodes (--control-plane, --worker): an event log holds no launch measurement", v)
			}
			if trust.EKRoots, err = readOptional("--ek-roots", ekRootsFile); err != nil {
				return err
			}
			if trust.EKIntermediates, err = readOptional("--ek-intermediates", ekInterFile); err != nil {
				return err
			}
			for _, f := range akFiles {
				pem, err := readOptional("--pinned-ak", f)
				if err != nil {
					return err
				}
				trust.PinnedAKs = append(trust.PinnedAKs, pem)
			}
			if len(gceProjects) > 0 || len(gceZones) > 0 {
				trust.GCE = &policy.GCEPolicy{Projects: gceProjects, Zones: gceZones}
			}
			if awsNitro {
				trust.AWSNitroTPM = &policy.AWSNitroTPMPolicy{AnyInstance: true}
			}
			var roles []captured
			for _, src := range []struct {
				role      policy.Role
				node, log string
			}{{policy.RoleControlPlane, cpNode, cpLog}, {policy.RoleWorker, workerNode, workerLog}} {
				var c captured
				switch {
				case src.node != "":
					c, err = captureNode(cmd.Context(), trust, src.node)
				case src.log != "":
					c, err = captureEventLog(trust.PCRs, src.log)
				default:
					continue
				}
				if err != nil {
					return fmt.Errorf("%s: %w", src.role, err)
				}
				c.role = src.role
				roles = append(roles, c)
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", src.role, c.provenance)
			}
			at := time.Now().UTC()
			files, err := referenceValueFiles(roles, at)
			if err != nil {
				return err
			}
			if v != attestation.VariantTPM {
				name, section, err := hardwareSection(v, roles, at)
				if err != nil {
					return err
				}
				files[name] = section
			}
			if awsNitro {
				if files["aws-nitrotpm.yaml"], err = nitroSection(roles, at); err != nil {
					return err
				}
			}
			for _, name := range slices.Sorted(maps.Keys(files)) {
				path := filepath.Join(outDir, name)
				if err := writeNew(path, files[name], 0o644, force); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s\n", path)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cpNode, "control-plane", "", "evidence address (host:port) of a golden control plane")
	f.StringVar(&workerNode, "worker", "", "evidence address (host:port) of a golden worker")
	f.StringVar(&cpLog, "control-plane-event-log", "", "boot event log of a golden control plane, replayed offline (Gatehouse's measured-boot log format)")
	f.StringVar(&workerLog, "worker-event-log", "", "boot event log of a golden worker, replayed offline")
	f.IntSliceVar(&trust.PCRs, "pcrs", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15}, "SHA-256 PCRs to capture (as the policy will select them)")
	f.StringVar(&ekRootsFile, "ek-roots", "", "trust the golden nodes' TPMs by their manufacturers' root CAs (PEM bundle)")
	f.StringVar(&ekInterFile, "ek-intermediates", "", "the manufacturers' issuing CAs (PEM bundle, with --ek-roots)")
	f.StringArrayVar(&akFiles, "pinned-ak", nil, "trust a golden node's attestation key (PEM public key; repeatable)")
	f.StringArrayVar(&gceProjects, "gce-project", nil, "trust Compute Engine vTPMs of this project (repeatable)")
	f.StringArrayVar(&gceZones, "gce-zone", nil, "with --gce-project: only instances in this zone (repeatable)")
	f.BoolVar(&awsNitro, "aws-nitro", false, "trust the golden nodes' AKs by their NitroTPM attestation documents, and write their SHA-384 PCRs to aws-nitrotpm.yaml (the awsNitroTPM section)")
	f.StringVar(&variant, "attestation", string(attestation.VariantTPM), "attestation variant of the golden nodes: tpm, sev-snp or tdx")
	f.StringVar(&hwRoots, "hardware-roots", "", "sev-snp or tdx: roots replacing AMD's or Intel's (an AMD KDS cert_chain, or a PEM root); only for test hierarchies")
	f.StringVarP(&outDir, "output-dir", "o", ".", "directory to write reference-values.yaml, control-plane.yaml and worker.yaml into")
	f.BoolVar(&force, "force", false, "overwrite existing files")
	return cmd
}

// captureNode reads fresh measurements from the node's evidence endpoint,
// trusting its attestation key as trust says.
func captureNode(ctx context.Context, trust policy.Policy, addr string) (captured, error) {
	v, err := trust.KeyVerifier(time.Now)
	if err != nil {
		return captured{}, fmt.Errorf("the golden node's key trust: %w", err)
	}
	result, err := atls.FetchEvidence(ctx, addr, []attestation.Verifier{v})
	if err != nil {
		return captured{}, err
	}
	endorsement := result.Endorsement
	if endorsement == "" {
		endorsement = "unknown"
	}
	return captured{
		values: result.Measurements,
		provenance: fmt.Sprintf("fresh evidence from %s over attested TLS at %s (identity %s, key trusted by %s)",
			addr, time.Now().UTC().Format(time.RFC3339), result.Identity, endorsement),
		hardware: result.Hardware,
	}, nil
}

// captureEventLog replays a boot event log; PCRs of pcrs it does not
// touch are zero, as on a TPM after that boot.
func captureEventLog(pcrs []int, path string) (captured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return captured{}, err
	}
	replayed, err := tpm.ReplayedPCRs(data)
	if err != nil {
		return captured{}, fmt.Errorf("%s: %w", path, err)
	}
	values := map[uint32][]byte{}
	for _, pcr := range pcrs {
		v, ok := replayed[uint32(pcr)]
		if !ok {
			v = make([]byte, sha256.Size)
		}
		values[uint32(pcr)] = v
	}
	sum := sha256.Sum256(data)
	return captured{values: values, provenance: fmt.Sprintf("replayed offline from the event log %s (sha256:%s)", path, hex.EncodeToString(sum[:]))}, nil
}

// referenceValueFiles splits captured roles into the common reference
// values (PCRs equal on every role) and each role's (the rest), as files
// with a header saying where they came from. With one role, every value is
// both common and the role's.
func referenceValueFiles(roles []captured, at time.Time) (map[string][]byte, error) {
	common, perRole := measurements.M{}, map[policy.Role]measurements.M{}
	for _, r := range roles {
		perRole[r.role] = measurements.M{}
	}
	for index, value := range roles[0].values {
		if index == keys.NodeLockPCR {
			continue
		}
		same := true
		for _, r := range roles[1:] {
			same = same && bytes.Equal(r.values[index], value)
		}
		if same {
			common[index] = measurements.Measurement{Expected: value}
		}
		for _, r := range roles {
			if !same || len(roles) == 1 {
				perRole[r.role][index] = measurements.Measurement{Expected: r.values[index]}
			}
		}
	}
	var header strings.Builder
	fmt.Fprintf(&header, "# Captured by `gatehouse reference-values capture` at %s from:\n", at.Format(time.RFC3339))
	for _, r := range roles {
		fmt.Fprintf(&header, "#   %s: %s\n", r.role, r.provenance)
	}
	files := map[string][]byte{}
	add := func(name, what string, m measurements.M) error {
		body, err := m.Marshal()
		if err != nil {
			return err
		}
		files[name] = append([]byte(header.String()+"# "+what+"\n"), body...)
		return nil
	}
	if len(common) > 0 {
		if err := add("reference-values.yaml", "PCRs every captured role measures alike (config generate --reference-values).", common); err != nil {
			return nil, err
		}
	}
	for _, r := range roles {
		if len(perRole[r.role]) == 0 {
			return nil, errors.New("no PCR tells the roles apart: the golden control plane and worker measure the same values, " +
				"so a worker's evidence would satisfy the control-plane role (docs/joinservice.md, \"Roles from evidence\")")
		}
		name := map[policy.Role]string{policy.RoleControlPlane: "control-plane.yaml", policy.RoleWorker: "worker.yaml"}[r.role]
		if err := add(name, fmt.Sprintf("PCRs that prove the %s role (config generate --%s-reference-values).", r.role, strings.TrimSuffix(name, ".yaml")), perRole[r.role]); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// nitroSection writes the awsNitroTPM policy section from the golden
// nodes' NitroTPM documents: the SHA-384 PCRs every role's document shows
// alike (the others differ by role, which the quote's SHA-256 role values
// prove), never PCR 15; comments say which node each came from.
func nitroSection(roles []captured, at time.Time) ([]byte, error) {
	common := measurements.M{}
	for _, r := range roles {
		if r.hardware == nil {
			return nil, fmt.Errorf("%s: the golden node's evidence carries no NitroTPM document", r.role)
		}
	}
	for index, value := range roles[0].hardware.Measurements {
		same := index != keys.NodeLockPCR
		for _, r := range roles[1:] {
			same = same && bytes.Equal(r.hardware.Measurements[index], value)
		}
		if same {
			common[index] = measurements.Measurement{Expected: value}
		}
	}
	if len(common) == 0 {
		return nil, errors.New("the golden nodes' NitroTPM documents share no PCR value")
	}
	body, err := common.Marshal()
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Captured by `gatehouse reference-values capture` at %s from:\n", at.Format(time.RFC3339))
	for _, r := range roles {
		fmt.Fprintf(&b, "#   %s: %s, %s\n", r.role, r.provenance, r.hardware.Endorsement)
	}
	b.WriteString("# The awsNitroTPM section of the attestation policy (next to variant: tpm): the SHA-384 PCRs\n" +
		"# every golden instance's document shows alike. Admit instances by instanceIDs, or say anyInstance.\n" +
		"awsNitroTPM:\n  anyInstance: true\n  referenceValues:\n")
	for _, line := range strings.Split(strings.TrimRight(string(body), "\n"), "\n") {
		b.WriteString("    " + line + "\n")
	}
	return []byte(b.String()), nil
}

// hardwareSection writes the sev-snp or tdx policy section from the golden
// nodes' hardware results: every distinct launch measurement (sev-snp), or
// the one MRTD and the RTMRs all roles share (tdx); comments say which
// node each came from.
func hardwareSection(v attestation.Variant, roles []captured, at time.Time) (string, []byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Captured by `gatehouse reference-values capture` at %s from:\n", at.Format(time.RFC3339))
	for _, r := range roles {
		if r.hardware == nil {
			return "", nil, fmt.Errorf("%s: the golden node's evidence has no hardware report", r.role)
		}
		fmt.Fprintf(&b, "#   %s: %s, %s\n", r.role, r.provenance, r.hardware.Endorsement)
	}
	if v == attestation.VariantSNP || v == attestation.VariantAzureSNP {
		fmt.Fprintf(&b, "# The sevSnp section of the attestation policy (next to variant: %s), or\n", v)
		b.WriteString(
			"# config generate --launch-measurement for each value.\nsevSnp:\n  launchMeasurements:\n")
		var seen []string
		for _, r := range roles {
			m := hex.EncodeToString(r.hardware.Measurements[0])
			if !slices.Contains(seen, m) {
				seen = append(seen, m)
				var from []string
				for _, o := range roles {
					if hex.EncodeToString(o.hardware.Measurements[0]) == m {
						from = append(from, string(o.role))
					}
				}
				fmt.Fprintf(&b, "    - %q # %s\n", m, strings.Join(from, ", "))
			}
		}
		b.WriteString("  # minimumTCB: set it from AMD's security bulletins; the golden nodes reported the TCBs above.\n")
		return "sev-snp.yaml", []byte(b.String()), nil
	}
	first := roles[0].hardware.Measurements
	for _, r := range roles[1:] {
		if !bytes.Equal(r.hardware.Measurements[0], first[0]) {
			return "", nil, fmt.Errorf("the golden nodes' MRTDs differ (%s: %x, %s: %x), and a tdx policy names one MRTD: boot every role from one TD image",
				roles[0].role, first[0], r.role, r.hardware.Measurements[0])
		}
	}
	b.WriteString("# The tdx section of the attestation policy (next to variant: tdx), or\n" +
		"# config generate --mrtd.\ntdx:\n")
	fmt.Fprintf(&b, "  mrtd: %q\n", hex.EncodeToString(first[0]))
	var rtmrs []string
	for i := uint32(1); i <= 4; i++ {
		same := true
		for _, r := range roles[1:] {
			same = same && bytes.Equal(r.hardware.Measurements[i], first[i])
		}
		if same && len(first[i]) > 0 {
			rtmrs = append(rtmrs, fmt.Sprintf("    %d: %q", i-1, hex.EncodeToString(first[i])))
		}
	}
	if len(rtmrs) > 0 {
		b.WriteString("  # RTMRs every role measured alike; drop those that change with configuration.\n  rtmrs:\n" + strings.Join(rtmrs, "\n") + "\n")
	}
	return "tdx.yaml", []byte(b.String()), nil
}
