package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gatehouse-dev/gatehouse/image/predict"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

// imageValuesCmds are the `gatehouse image` commands about an image's
// reference values: keys, prediction, signing, platform profiles.
func imageValuesCmds() []*cobra.Command {
	return []*cobra.Command{newImageKeygenCmd(), newImagePredictCmd(), newImageSignValuesCmd(), newImageMeasurePlatformCmd()}
}

func newImageKeygenCmd() *cobra.Command {
	var privFile, pubFile string
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Create the Ed25519 key pair that signs an image's reference values",
		Long: "Write a new Ed25519 key pair: the private key (PKCS#8 PEM, mode 0600) signs the reference values\n" +
			"of the images you build (gatehouse image sign-values, or the image build with a signing key);\n" +
			"the public key (PKIX PEM) is what `gatehouse config generate --verify-key` trusts. Keep the\n" +
			"private key off the machines that run clusters (docs/attestation.md, \"Signed reference values\").",
		Example: "  gatehouse image keygen --private-key values-signing.key --public-key values-signing.pub",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			privPEM, pubPEM, err := signedvalues.GenerateKey()
			if err != nil {
				return err
			}
			pub, err := signedvalues.ParsePublicKey(pubPEM)
			if err != nil {
				return err
			}
			keyID, err := signedvalues.KeyID(pub)
			if err != nil {
				return err
			}
			if err := writeNew(pubFile, pubPEM, 0o644, force); err != nil {
				return err
			}
			if err := writeNew(privFile, privPEM, 0o600, force); err != nil {
				return errors.Join(err, os.Remove(pubFile))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s (private, keep it secret) and %s (public, key id %s)\n", privFile, pubFile, keyID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&privFile, "private-key", "values-signing.key", "file to write the private key to (PKCS#8 PEM, mode 0600)")
	f.StringVar(&pubFile, "public-key", "values-signing.pub", "file to write the public key to (PKIX PEM)")
	f.BoolVar(&force, "force", false, "overwrite existing key files")
	return cmd
}

func newImageSignValuesCmd() *cobra.Command {
	var keyFile, in, out string
	var force bool
	cmd := &cobra.Command{
		Use:   "sign-values",
		Short: "Sign an image's predicted reference values",
		Long: "Sign the unsigned reference values an image build (or gatehouse image predict) wrote, with an\n" +
			"Ed25519 or ECDSA P-256 private key (PEM), into a signed reference-value file: a DSSE envelope\n" +
			"that `gatehouse config generate --reference-values-from FILE --verify-key KEY` accepts\n" +
			"(docs/attestation.md, \"Signed reference values\"). Review the values first: signing vouches for them.",
		Example: "  gatehouse image sign-values --key values-signing.key --in values.json --out values.signed.json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile == "" || in == "" || out == "" {
				return errors.New("--key, --in and --out are required")
			}
			keyPEM, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			key, err := signedvalues.ParsePrivateKey(keyPEM)
			if err != nil {
				return fmt.Errorf("--key %s: %w", keyFile, err)
			}
			data, err := os.ReadFile(in)
			if err != nil {
				return fmt.Errorf("--in: %w", err)
			}
			v, err := signedvalues.ParsePayload(data)
			if err != nil {
				return fmt.Errorf("--in %s: %w", in, err)
			}
			signed, err := signedvalues.Sign(cmd.Context(), v, key)
			if err != nil {
				return err
			}
			if err := writeNew(out, signed, 0o644, force); err != nil {
				return err
			}
			keyID, err := signedvalues.KeyID(key.Public())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s: reference values of image %s %s on platform %s, signed by key %s\n", out, v.Image.Name, v.Image.Version, v.Platform, keyID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&keyFile, "key", "", "private key to sign with (PEM: PKCS#8 Ed25519 or ECDSA P-256, or SEC 1 P-256)")
	f.StringVar(&in, "in", "", "unsigned reference values (JSON or YAML, the payload the image build writes)")
	f.StringVar(&out, "out", "", "signed reference-value file to write")
	f.BoolVar(&force, "force", false, "overwrite an existing --out file")
	return cmd
}

func newImagePredictCmd() *cobra.Command {
	var (
		b                                   predict.Build
		cpUKI, workerUKI, manifest, keyFile string
		out, signedOut                      string
		force                               bool
	)
	cmd := &cobra.Command{
		Use:   "predict",
		Short: "Predict the PCRs an image's UKIs produce on a platform",
		Long: "Predict the TPM PCR values each role's UKI produces when the platform's firmware boots it, with\n" +
			"the events behind each value and where each came from, and write them as the unsigned reference\n" +
			"values (--output) and, with --key, signed (--signed-output). The image build does this itself;\n" +
			"this command predicts for UKIs built elsewhere. Platforms: the embedded profiles (qemu-ovmf) or a\n" +
			"profile file from gatehouse image measure-platform (--platform-file). docs/image.md lists what\n" +
			"each PCR holds.",
		Example: "  gatehouse image predict --control-plane-uki uki-controlplane.efi --worker-uki uki-worker.efi \\\n" +
			"    --image-name gatehouse-node --image-version v0.1.0 --manifest manifest.json --root-hash <hex> --output values.json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cpUKI == "" && workerUKI == "" {
				return errors.New("give --control-plane-uki and/or --worker-uki")
			}
			if manifest == "" || out == "" {
				return errors.New("--manifest and --output are required")
			}
			if (keyFile == "") != (signedOut == "") {
				return errors.New("--key and --signed-output go together")
			}
			data, err := os.ReadFile(manifest)
			if err != nil {
				return fmt.Errorf("--manifest: %w", err)
			}
			sum := sha256.Sum256(data)
			b.Image.ManifestSHA256 = hex.EncodeToString(sum[:])
			b.UKIs = map[policy.Role]string{}
			if cpUKI != "" {
				b.UKIs[policy.RoleControlPlane] = cpUKI
			}
			if workerUKI != "" {
				b.UKIs[policy.RoleWorker] = workerUKI
			}
			var keyPEM []byte
			if keyFile != "" {
				if keyPEM, err = os.ReadFile(keyFile); err != nil {
					return fmt.Errorf("--key: %w", err)
				}
			}
			result, err := predict.ReferenceValues(cmd.Context(), b, keyPEM)
			if err != nil {
				return err
			}
			printValues(cmd.OutOrStdout(), result.Values)
			if err := writeNew(out, append(result.Payload, '\n'), 0o644, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s\n", out)
			if signedOut != "" {
				if err := writeNew(signedOut, result.Signed, 0o644, force); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s\n", signedOut)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cpUKI, "control-plane-uki", "", "the control plane's UKI")
	f.StringVar(&workerUKI, "worker-uki", "", "the worker's UKI")
	f.StringVar(&b.Platform, "platform", "qemu-ovmf", "platform profile the firmware PCRs and PCR 4's firmware events come from")
	f.StringVar(&b.PlatformFile, "platform-file", "", "a measured platform profile (gatehouse image measure-platform) instead of the embedded one")
	f.StringVar(&b.Image.Name, "image-name", "gatehouse-node", "the image's name")
	f.StringVar(&b.Image.Version, "image-version", "", "the image's version")
	f.StringVar(&manifest, "manifest", "", "the image build's manifest (its SHA-256 goes into the values)")
	f.StringVar(&b.Image.RootHash, "root-hash", "", "the dm-verity root hash of the image's root file system (hex)")
	f.StringVarP(&out, "output", "o", "", "file to write the unsigned reference values to (canonical JSON)")
	f.StringVar(&keyFile, "key", "", "private key to sign with (gatehouse image keygen)")
	f.StringVar(&signedOut, "signed-output", "", "with --key: file to write the signed reference values to")
	f.BoolVar(&force, "force", false, "overwrite existing output files")
	return cmd
}

// printValues lists each role's predicted PCRs with their events, and the
// notes.
func printValues(w io.Writer, v signedvalues.Values) {
	for _, role := range slices.Sorted(maps.Keys(v.Roles)) {
		fmt.Fprintf(w, "%s:\n", role)
		printPCRs(w, v.Roles[role], "  ")
	}
	for _, n := range v.Notes {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
}

// printPCRs lists PCRs with their events, indented.
func printPCRs(w io.Writer, m measurements.M, indent string) {
	for _, index := range m.Indices() {
		fmt.Fprintf(w, "%sPCR %d = %s\n", indent, index, hex.EncodeToString(m[index].Expected))
		for _, e := range m[index].Events {
			fmt.Fprintf(w, "%s  %s %q %s… (%s)\n", indent, e.Type, e.Description, hex.EncodeToString(e.Digest)[:16], e.Source)
		}
	}
}

func newImageMeasurePlatformCmd() *cobra.Command {
	var (
		log, name, description, source, out string
		pcrs                                []uint
		force                               bool
	)
	cmd := &cobra.Command{
		Use:   "measure-platform",
		Short: "Write a platform profile from a real boot's TCG event log",
		Long: "Read the TCG event log of a real boot on a platform (a node's\n" +
			"/sys/kernel/security/tpm0/binary_bios_measurements) and write the platform profile the\n" +
			"prediction takes the firmware's part from: the firmware PCRs (--pcrs) with their events, and\n" +
			"the events the firmware extends into PCR 4 before the UKI. The log is not authenticated: take\n" +
			"it from a machine you trust. Pass the profile to gatehouse image predict --platform-file, or\n" +
			"replace image/predict/platforms/NAME.yaml with it.",
		Example: "  gatehouse image measure-platform --event-log binary_bios_measurements --name qemu-ovmf \\\n" +
			"    --description \"QEMU q35 with Debian 12's OVMF 2022.11, Secure Boot off\" \\\n" +
			"    --source \"QEMU 7.2, ovmf 2022.11-6+deb12u2, booted 2026-07-01\" --output qemu-ovmf.yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if log == "" || name == "" || out == "" {
				return errors.New("--event-log, --name and --output are required")
			}
			if source == "" {
				return errors.New("--source is required: say where and when the log was taken (machine, firmware version, date), so the profile says where its values came from")
			}
			data, err := os.ReadFile(log)
			if err != nil {
				return fmt.Errorf("--event-log: %w", err)
			}
			indices := make([]uint32, len(pcrs))
			for i, p := range pcrs {
				indices[i] = uint32(p)
			}
			p, err := predict.PlatformFromEventLog(data, name, description, source, indices)
			if err != nil {
				return fmt.Errorf("--event-log %s: %w", log, err)
			}
			profile, err := p.Marshal()
			if err != nil {
				return err
			}
			if err := writeNew(out, profile, 0o644, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s: platform %s, PCRs %s and PCR 4's firmware events\n", out, name, strings.Trim(fmt.Sprint(pcrs), "[]"))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&log, "event-log", "", "the TCG event log of a real boot (binary_bios_measurements)")
	f.StringVar(&name, "name", "", "the platform's name, e.g. qemu-ovmf")
	f.StringVar(&description, "description", "", "what the platform is (machine, firmware, Secure Boot state)")
	f.StringVar(&source, "source", "", "where and when the log was taken (machine, firmware package version, date)")
	defaults := make([]uint, len(predict.DefaultPlatformPCRs))
	for i, p := range predict.DefaultPlatformPCRs {
		defaults[i] = uint(p)
	}
	f.UintSliceVar(&pcrs, "pcrs", defaults, "firmware PCRs to take from the log (0-3, 5-7)")
	f.StringVarP(&out, "output", "o", "", "platform profile file to write (YAML)")
	f.BoolVar(&force, "force", false, "overwrite an existing --output file")
	return cmd
}
