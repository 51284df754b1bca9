package cli

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

// signedRefs are a signed file's values in the policy's form: the common
// reference values and each role's, as JSON.
type signedRefs struct {
	common string
	roles  map[policy.Role]string
}

// readSignedReferenceValues verifies the signed reference-value file with
// the public key in keyFile and splits its values into the policy's common
// and per-role reference values (events included). The quoted PCRs (*pcrs)
// grow to cover every PCR the file names unless --pcrs was given, when a
// PCR it lacks is an error. It prints the file's signer, image and notes.
func readSignedReferenceValues(cmd *cobra.Command, file, keyFile string, pcrs *[]int) (signedRefs, error) {
	if file == "" || keyFile == "" {
		return signedRefs{}, errors.New("--reference-values-from and --verify-key go together: a signed file is worth only the key it is checked with")
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return signedRefs{}, fmt.Errorf("--verify-key: %w", err)
	}
	pub, err := signedvalues.ParsePublicKey(keyPEM)
	if err != nil {
		return signedRefs{}, fmt.Errorf("--verify-key %s: %w", keyFile, err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return signedRefs{}, fmt.Errorf("--reference-values-from: %w", err)
	}
	v, err := signedvalues.Verify(cmd.Context(), data, pub)
	if errors.Is(err, signedvalues.ErrUnsigned) {
		return signedRefs{}, fmt.Errorf("--reference-values-from %s: %w; values nobody signed go to --reference-values, --control-plane-reference-values and --worker-reference-values instead", file, err)
	}
	if err != nil {
		return signedRefs{}, fmt.Errorf("--reference-values-from %s: %w", file, err)
	}
	if _, ok := v.Roles[policy.RoleControlPlane]; !ok {
		return signedRefs{}, fmt.Errorf("--reference-values-from %s has no %s values: the first node is a control plane", file, policy.RoleControlPlane)
	}
	common, roles := v.Split()
	for role, m := range roles {
		if len(m) == 0 {
			return signedRefs{}, fmt.Errorf("--reference-values-from %s: the roles' values are equal at every PCR, so %s has none of its own and a worker's evidence "+
				"would satisfy the control-plane role; sign values of UKIs that differ in their command line (docs/joinservice.md, \"Roles from evidence\")", file, role)
		}
	}
	var missing []int
	for _, m := range append([]measurements.M{common}, slices.Collect(maps.Values(roles))...) {
		for _, index := range m.Indices() {
			if !slices.Contains(*pcrs, int(index)) && !slices.Contains(missing, int(index)) {
				missing = append(missing, int(index))
			}
		}
	}
	if len(missing) > 0 {
		if cmd.Flags().Changed("pcrs") {
			return signedRefs{}, fmt.Errorf("--pcrs lacks PCRs %v, which the signed reference values check: add them, or leave --pcrs out", missing)
		}
		*pcrs = slices.Sorted(slices.Values(append(*pcrs, missing...)))
	}
	out := signedRefs{roles: map[policy.Role]string{}}
	if out.common, err = valuesJSON(common); err != nil {
		return signedRefs{}, err
	}
	for role, m := range roles {
		if out.roles[role], err = valuesJSON(m); err != nil {
			return signedRefs{}, err
		}
	}
	keyID, err := signedvalues.KeyID(pub)
	if err != nil {
		return signedRefs{}, err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "Reference values from %s: image %s %s (manifest sha256:%s, root hash %s) on platform %s, signed by key %s\n",
		file, v.Image.Name, v.Image.Version, v.Image.ManifestSHA256, v.Image.RootHash, v.Platform, keyID)
	fmt.Fprintf(w, "  shared by every role: PCRs %v\n", common.Indices())
	for _, role := range slices.Sorted(maps.Keys(roles)) {
		fmt.Fprintf(w, "  %s: PCRs %v\n", role, roles[role].Indices())
	}
	for _, n := range v.Notes {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
	return out, nil
}

// valuesJSON returns m in package measurements' file form as JSON.
func valuesJSON(m measurements.M) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	y, err := m.Marshal()
	if err != nil {
		return "", err
	}
	j, err := yaml.YAMLToJSON(y)
	return string(j), err
}
