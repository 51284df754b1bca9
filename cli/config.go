package cli

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the cluster configuration file",
	}
	cmd.AddCommand(newConfigGenerateCmd())
	return cmd
}

func newConfigGenerateCmd() *cobra.Command {
	var (
		out, name, version, refFile, serviceCIDR, podCIDR  string
		cpRefFile, workerRefFile, ekRootsFile, ekInterFile string
		signedRefFile, verifyKeyFile                       string
		akFiles, gceProjects, gceZones                     []string
		pcrs                                               []int
		force                                              bool
		variant, mrtd, minimumTCB, collateralCache         string
		launchMeasurements                                 []string
		mirrorFiles, mirrorRegistry                        string
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Write a commented cluster configuration",
		Long: "Write a commented cluster configuration file. The attestation policy needs the\n" +
			"reference values of what the nodes boot (--reference-values, a JSON or YAML map of\n" +
			"PCR index to {expected: <hex>, warnOnly: <bool>}), the values that prove each role\n" +
			"(--control-plane-reference-values, --worker-reference-values; docs/joinservice.md,\n" +
			"\"Roles from evidence\") and how the nodes' attestation keys are trusted: the CAs of\n" +
			"their TPMs' manufacturers (--ek-roots, a PEM bundle; any TPM they made joins, with\n" +
			"no key registered), Compute Engine vTPMs of named projects (--gce-project), or\n" +
			"registered keys (--pinned-ak, PEM public keys).\n\n" +
			"--attestation chooses the variant: tpm (the default), gcp-vtpm (tpm with\n" +
			"--gce-project), sev-snp (confidential VMs whose SEV-SNP report binds their vTPM's\n" +
			"key: --launch-measurement, --snp-minimum-tcb), azure-sev-snp (Azure confidential VMs\n" +
			"whose paravisor's HCL report binds their vTPM's key: the same two flags, naming the\n" +
			"paravisor's launch measurements) or tdx (--mrtd). The file comments\n" +
			"every field of the variant's section.\n\n" +
			"--reference-values-from takes every reference value from a signed reference-value file an\n" +
			"image build wrote (docs/attestation.md, \"Signed reference values\"), checked with the\n" +
			"signer's public key (--verify-key): values all roles share go to referenceValues, the others\n" +
			"to each role, events included, and the quoted PCRs grow to cover them. An unsigned, altered or\n" +
			"wrongly signed file is refused.",
		Example: "  gatehouse config generate --reference-values-from values.signed.json --verify-key values-signing.pub --ek-roots tpm-vendor-roots.pem\n" +
			"  gatehouse config generate --reference-values refs.yaml \\\n" +
			"    --control-plane-reference-values cp.yaml --worker-reference-values worker.yaml --ek-roots tpm-vendor-roots.pem\n" +
			"  gatehouse config generate --attestation sev-snp --launch-measurement <hex> --snp-minimum-tcb 3.0.8.115 \\\n" +
			"    --reference-values refs.yaml --control-plane-reference-values cp.yaml --worker-reference-values worker.yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			trust := 0
			for _, set := range []bool{len(akFiles) > 0, ekRootsFile != "", len(gceProjects) > 0} {
				if set {
					trust++
				}
			}
			hw, err := hardwareValues(variant, launchMeasurements, minimumTCB, mrtd, trust, len(gceProjects) > 0)
			if err != nil {
				return err
			}
			signed := signedRefFile != "" || verifyKeyFile != ""
			if signed {
				if refFile != "" || cpRefFile != "" || workerRefFile != "" {
					return errors.New("--reference-values-from replaces --reference-values, --control-plane-reference-values and --worker-reference-values: give signed or unsigned values, not both")
				}
				if hw.Variant != "tpm" {
					return fmt.Errorf("--reference-values-from holds TPM PCR values; --attestation %s takes its values from its own flags", variant)
				}
			}
			if (!signed && (refFile == "" || cpRefFile == "")) || (hw.Variant == "tpm" && trust != 1) {
				return errors.New("--reference-values, --control-plane-reference-values and (for tpm) one of --ek-roots, --gce-project and --pinned-ak are required: " +
					"without them the policy would accept any software, any role or any TPM")
			}
			if len(gceZones) > 0 && len(gceProjects) == 0 {
				return errors.New("--gce-zone needs --gce-project")
			}
			if ekInterFile != "" && ekRootsFile == "" {
				return errors.New("--ek-intermediates needs --ek-roots")
			}
			var refJSON string
			roles := map[policy.Role]string{}
			if signed {
				values, err := readSignedReferenceValues(cmd, signedRefFile, verifyKeyFile, &pcrs)
				if err != nil {
					return err
				}
				refJSON, roles = values.common, values.roles
			} else {
				if refJSON, err = readReferenceValues("--reference-values", refFile); err != nil {
					return err
				}
				if roles[policy.RoleControlPlane], err = readReferenceValues("--control-plane-reference-values", cpRefFile); err != nil {
					return err
				}
			}
			if workerRefFile != "" {
				if roles[policy.RoleWorker], err = readReferenceValues("--worker-reference-values", workerRefFile); err != nil {
					return err
				}
			}
			var aks []string
			for _, f := range akFiles {
				pem, err := os.ReadFile(f)
				if err != nil {
					return fmt.Errorf("--pinned-ak: %w", err)
				}
				aks = append(aks, strings.TrimSpace(string(pem))+"\n")
			}
			ekRoots, err := readOptional("--ek-roots", ekRootsFile)
			if err != nil {
				return err
			}
			ekInter, err := readOptional("--ek-intermediates", ekInterFile)
			if err != nil {
				return err
			}
			release, err := versions.Resolve(version)
			if err != nil {
				return fmt.Errorf("--kubernetes-version: %w", err)
			}
			data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
				Name: name, KubernetesVersion: release.Version, ReferenceValues: refJSON, RoleReferenceValues: roles,
				PCRs: pcrs, PinnedAKs: aks, EKRoots: ekRoots, EKIntermediates: ekInter,
				GCEProjects: gceProjects, GCEZones: gceZones, ServiceCIDR: serviceCIDR, PodCIDR: podCIDR,
				Variant: hw.Variant, LaunchMeasurements: hw.LaunchMeasurements, MinimumTCB: hw.MinimumTCB, MRTD: hw.MRTD,
				CollateralCache: collateralCache, Mirror: mirrorOf(mirrorFiles, mirrorRegistry),
			})
			if err != nil {
				return err
			}
			if err := writeNew(out, data, 0o644, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s (Kubernetes %s). Review it, then run: gatehouse init --config %s --node <address>\n", out, release.Version, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", clusterconfig.DefaultPath, "file to write")
	f.StringVar(&name, "name", "gatehouse", "cluster name (DNS-1123 label)")
	f.StringVar(&version, "kubernetes-version", versions.Default().Version, "Kubernetes version: 1.MINOR or v1.MINOR.PATCH; supported: "+strings.Join(versions.Supported(), ", "))
	f.StringVar(&refFile, "reference-values", "", "file with the PCR values every node shares (JSON or YAML)")
	f.StringVar(&cpRefFile, "control-plane-reference-values", "", "file with the PCR values that prove the control-plane role (JSON or YAML)")
	f.StringVar(&workerRefFile, "worker-reference-values", "", "file with the PCR values that prove the worker role (JSON or YAML); without it no node can join as a worker")
	f.StringVar(&signedRefFile, "reference-values-from", "", "signed reference-value file of an image build (DSSE JSON), instead of the three files above; needs --verify-key")
	f.StringVar(&verifyKeyFile, "verify-key", "", "public key (PEM) of the image build's signing key, which --reference-values-from must be signed by")
	f.StringArrayVar(&akFiles, "pinned-ak", nil, "PEM public key of a trusted attestation key (repeatable); or else --ek-roots")
	f.StringVar(&ekRootsFile, "ek-roots", "", "PEM bundle of the root CAs of the nodes' TPM manufacturers: TPMs whose EK certificate chains to one join with no registered key")
	f.StringVar(&ekInterFile, "ek-intermediates", "", "PEM bundle of the TPM manufacturers' issuing CAs (with --ek-roots)")
	f.StringArrayVar(&gceProjects, "gce-project", nil, "trust the Compute Engine vTPMs of this project (repeatable), by the AK certificates Google's vTPM CA issues")
	f.StringArrayVar(&gceZones, "gce-zone", nil, "with --gce-project: only instances in this zone (repeatable)")
	f.StringVar(&variant, "attestation", "tpm", "attestation variant: tpm, gcp-vtpm, sev-snp, azure-sev-snp or tdx")
	f.StringArrayVar(&launchMeasurements, "launch-measurement", nil, "sev-snp: an accepted launch measurement, hex (repeatable)")
	f.StringVar(&minimumTCB, "snp-minimum-tcb", "", "sev-snp: lowest acceptable TCB, BOOTLOADER.TEE.SNP.MICROCODE, e.g. 3.0.8.115")
	f.StringVar(&mrtd, "mrtd", "", "tdx: the TD's MRTD, hex")
	f.StringVar(&collateralCache, "collateral-cache", "/var/lib/gatehouse/collateral", "sev-snp and tdx: directory caching AMD KDS or Intel PCS collateral")
	f.IntSliceVar(&pcrs, "pcrs", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15}, "SHA-256 PCRs quotes must cover; must include 15")
	f.StringVar(&serviceCIDR, "service-cidr", "10.96.0.0/12", "Service CIDR")
	f.StringVar(&podCIDR, "pod-cidr", "10.244.0.0/16", "pod CIDR")
	f.BoolVar(&force, "force", false, "overwrite an existing file")
	f.StringVar(&mirrorFiles, "mirror-files", "", "installs without internet: base URL of your file server mirroring the Kubernetes components (docs/install-airgapped.md)")
	f.StringVar(&mirrorRegistry, "mirror-registry", "", "installs without internet: host[:port][/prefix] of your OCI registry mirroring the images (docs/install-airgapped.md)")
	return cmd
}

// hardwareValues checks the flags of variant (tpm, gcp-vtpm, sev-snp or
// tdx) and returns the template's variant fields; keyTrust counts the TPM
// key trust flags set.
func hardwareValues(variant string, launch []string, minimumTCB, mrtd string, keyTrust int, gce bool) (clusterconfig.TemplateValues, error) {
	var v clusterconfig.TemplateValues
	switch variant {
	case "tpm":
	case "gcp-vtpm":
		if !gce {
			return v, errors.New("--attestation gcp-vtpm needs --gce-project: the projects whose Compute Engine vTPMs may join")
		}
		variant = "tpm"
	case "sev-snp", "azure-sev-snp", "tdx":
		if keyTrust > 0 {
			return v, fmt.Errorf("--attestation %s trusts the vTPM key the hardware report binds: drop --ek-roots, --gce-project and --pinned-ak", variant)
		}
	default:
		return v, fmt.Errorf("--attestation %q: use tpm, gcp-vtpm, sev-snp, azure-sev-snp or tdx", variant)
	}
	v.Variant = variant
	if variant == "sev-snp" || variant == "azure-sev-snp" {
		if len(launch) == 0 || minimumTCB == "" {
			return v, fmt.Errorf("--attestation %s needs --launch-measurement (hex, repeatable) and --snp-minimum-tcb "+
				"(BOOTLOADER.TEE.SNP.MICROCODE): without them any VM image or firmware would be accepted", variant)
		}
		if _, err := fmt.Sscanf(minimumTCB, "%d.%d.%d.%d", &v.MinimumTCB.Bootloader, &v.MinimumTCB.TEE, &v.MinimumTCB.SNP, &v.MinimumTCB.Microcode); err != nil {
			return v, fmt.Errorf("--snp-minimum-tcb %q: want BOOTLOADER.TEE.SNP.MICROCODE, e.g. 3.0.8.115", minimumTCB)
		}
		v.LaunchMeasurements = launch
	} else if len(launch) > 0 || minimumTCB != "" {
		return v, errors.New("--launch-measurement and --snp-minimum-tcb are for --attestation sev-snp or azure-sev-snp")
	}
	if variant == "tdx" {
		if mrtd == "" {
			return v, errors.New("--attestation tdx needs --mrtd (hex): without it any TD image would be accepted")
		}
		v.MRTD = mrtd
	} else if mrtd != "" {
		return v, errors.New("--mrtd is for --attestation tdx")
	}
	return v, nil
}

// readOptional reads file, named by flag in errors; "" reads nothing.
func readOptional(flag, file string) (string, error) {
	if file == "" {
		return "", nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return string(data), nil
}

// readReferenceValues reads a reference value file (JSON or YAML,
// package measurements' format) and returns it as JSON.
func readReferenceValues(flag, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	refs, err := measurements.Parse(raw, 32)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flag, path, err)
	}
	refYAML, err := refs.Marshal()
	if err != nil {
		return "", err
	}
	refJSON, err := yaml.YAMLToJSON(refYAML)
	return string(refJSON), err
}

// writeNew writes data to path with mode; unless force, an existing file
// is an error naming it.
func writeNew(path string, data []byte, mode fs.FileMode, force bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists; move it away or choose another file (--force overwrites configuration files)", path)
	}
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func gunzip(data []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(zr, 16<<20))
}
