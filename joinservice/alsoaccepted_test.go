package joinservice

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// TestAlsoAcceptedKeepsRoles: a node admitted only through a role's
// alsoAccepted set (in a local cluster: a VM of the node image beside
// namespace nodes, docs/joinservice.md) holds that role and no other.
// Asking for the control-plane role is refused with nothing issued (was
// open if the further sets were accepted for every role); its worker join
// is allowed.
func TestAlsoAcceptedKeepsRoles(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	data := h.joinConfigData(t, nil)
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(data[joinconfig.KeyAttestation]), &doc); err != nil {
		t.Fatal(err)
	}
	other := func(b string) map[string]map[string]any {
		return map[string]map[string]any{fmt.Sprint(rolePCR): {"expected": strings.Repeat(b, 32)}}
	}
	// The simulator node measures the worker's values: they are the
	// worker role's further set; its own set and the control plane's
	// further set are values no node here measures.
	doc["roles"] = map[policy.Role]any{
		policy.RoleWorker: map[string]any{
			"referenceValues": other("ee"),
			"alsoAccepted":    []any{referenceValues(t, bootArtefacts(policy.RoleWorker), rolePCR)},
		},
		policy.RoleControlPlane: map[string]any{
			"referenceValues": referenceValues(t, bootArtefacts(policy.RoleControlPlane), rolePCR),
			"alsoAccepted":    []any{other("dd")},
		},
	}
	doc2, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	data[joinconfig.KeyAttestation] = string(doc2)
	h.putConfigMap(t, testJoinConfig, data)
	h.waitReloads(t, testJoinConfig, "applied", 2)

	node := h.dial(t, h.node.attester, "")
	before := h.snapshot(t)
	_, err = node.IssueJoinTicket(ctx, joinRequest(t, "vm-1", net.IPv4(10, 0, 0, 11), true))
	h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "role_not_attested")
	h.assertNothingIssued(t, before)

	if _, err := node.IssueJoinTicket(ctx, joinRequest(t, "vm-1", net.IPv4(10, 0, 0, 11), false)); err != nil {
		t.Fatalf("the worker's join through the role's further set: %v", err)
	}
}
