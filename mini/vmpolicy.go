package mini

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
)

// Files of a node image's directory (docs/image.md) that the join policy
// of a cluster with VM nodes reads.
const (
	imageSignedValues = "reference-values.signed.json"
	imageVerifyKey    = "signing-key.pub"
)

// VMMemoryMiB is a VM node's memory. The node image's signed values
// predict PCR 0 for platform qemu-ovmf, which was measured with 2 GiB:
// OVMF measures a firmware volume whose digest depends on the memory size
// (docs/image.md), so a VM of another size is refused. 2 GiB, not 1: a
// control plane's etcd, API server, controller manager, scheduler,
// kubelet and containerd stalled a 1 GiB guest for minutes at a time.
const VMMemoryMiB = 2048

// imageValues reads the node image's signed reference values in
// imageDir and checks their signature with the image's verify key beside
// them: the values a VM node of that image proves for each role, events
// included.
func imageValues(ctx context.Context, imageDir string) (signedvalues.Values, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, imageSignedValues))
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("the node image's signed reference values: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(imageDir, imageVerifyKey))
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("the node image's verify key: %w", err)
	}
	key, err := signedvalues.ParsePublicKey(keyPEM)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("the node image's verify key %s: %w", filepath.Join(imageDir, imageVerifyKey), err)
	}
	v, err := signedvalues.Verify(ctx, data, key)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("the node image's reference values %s: %w", filepath.Join(imageDir, imageSignedValues), err)
	}
	return v, nil
}

// acceptVMNodes makes the cluster policy in tv accept VM nodes of the
// node image in imageDir beside the namespace nodes: the image's signed
// values of each role become that role's alsoAccepted set. The two kinds
// measure different things (a namespace node its bootstrapper and boot
// manifest into PCR 4 and its role into PCR 8; a VM the firmware, its UKI
// and command line into PCRs 0-13), so nothing is shared: the shared
// values move into each role's own. The quoted selection is the union of
// both (PCRs: namespace nodes quote the VM's selection too). The policy
// does not require an event log: namespace nodes have none; a VM's log is
// replayed whenever it comes, so its refusals still name the event.
func acceptVMNodes(ctx context.Context, tv *clusterconfig.TemplateValues, imageDir string) error {
	v, err := imageValues(ctx, imageDir)
	if err != nil {
		return err
	}
	var shared map[string]json.RawMessage
	if err := json.Unmarshal([]byte(tv.ReferenceValues), &shared); err != nil {
		return fmt.Errorf("the namespace nodes' reference values: %w", err)
	}
	tv.RoleAlsoAccepted = map[policy.Role][]string{}
	for role, own := range tv.RoleReferenceValues {
		var values map[string]json.RawMessage
		if err := json.Unmarshal([]byte(own), &values); err != nil {
			return fmt.Errorf("the namespace nodes' %s reference values: %w", role, err)
		}
		for pcr, value := range shared {
			values[pcr] = value
		}
		merged, err := json.Marshal(values)
		if err != nil {
			return err
		}
		tv.RoleReferenceValues[role] = string(merged)
		image, ok := v.Roles[role]
		if !ok {
			return fmt.Errorf("the node image's reference values have no %s role", role)
		}
		for _, pcr := range image.Indices() {
			if !slices.Contains(tv.PCRs, int(pcr)) {
				return fmt.Errorf("the node image's %s values set PCR %d, which the nodes do not quote (%v)", role, pcr, tv.PCRs)
			}
		}
		data, err := image.Marshal()
		if err != nil {
			return err
		}
		// One line of JSON, as the configuration's template takes values.
		if data, err = yaml.YAMLToJSON(data); err != nil {
			return err
		}
		tv.RoleAlsoAccepted[role] = []string{string(data)}
	}
	tv.ReferenceValues = "{}"
	no := false
	tv.RequireEventLog = &no
	return nil
}
