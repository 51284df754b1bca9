//go:build vmnodes

package capiboot

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// imagePCRs are the PCRs the node image's bootstrapper quotes (its unit's
// --pcrs, image/build's recipe): a policy must select exactly these.
var imagePCRs = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15}

// rolePCR is the PCR the local cluster's policy tells roles by (mini's
// rolePCR); nothing extends it when the node image boots, so a VM quotes
// it as zero.
const rolePCR = "8"

// acceptImage makes the local cluster's join service admit a worker VM of
// the node image, appraised against the image build's reference values:
//   - the policy selects the PCRs the image quotes (imagePCRs; the
//     network-namespace nodes quote mini's three, so their continuous
//     attestation fails from now on: its action becomes "none", the
//     condition only, so that no taint moves the control plane's pods);
//   - the worker role expects the image's worker values (firmware, UKI,
//     kernel, command line, dm-verity root hash; the events behind each)
//     and a zero role PCR, which tells it from the control-plane role
//     (the cluster has no network-namespace workers);
//   - PCR 4, which every node's evidence must match, also accepts the
//     image's.
//
// The VM's TPM comes from the cluster's own manufacturer CA, which the
// policy trusts already. The join service applies the ConfigMap live. The
// QEMU node provider of mini (issue 36) is to make such a mixed policy
// itself.
func acceptImage(ctx context.Context, t *testing.T, kube kubernetes.Interface, image testenv.NodeImage) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(image.Dir, "reference-values.json"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Roles map[string]map[string]map[string]any `json:"roles"`
	}
	if err := json.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	worker := values.Roles["worker"]
	pcr4, _ := worker["4"]["expected"].(string)
	if pcr4 == "" {
		t.Fatalf("the image's reference values have no worker PCR 4")
	}
	worker[rolePCR] = map[string]any{"expected": strings.Repeat("0", 64)}
	cms := kube.CoreV1().ConfigMaps(charts.Namespace)
	cm, err := cms.Get(ctx, "gatehouse-join-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var policy map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["attestation.yaml"]), &policy); err != nil {
		t.Fatal(err)
	}
	common, ok := policy["referenceValues"].(map[string]any)["4"].(map[string]any)
	roles, ok2 := policy["roles"].(map[string]any)["worker"].(map[string]any)
	if !ok || !ok2 {
		t.Fatalf("the local cluster's policy has no PCR 4 or no worker role:\n%s", cm.Data["attestation.yaml"])
	}
	list, _ := common["alsoAccepted"].([]any)
	common["alsoAccepted"] = append(list, pcr4)
	roles["referenceValues"] = worker
	policy["pcrs"] = imagePCRs
	out, err := yaml.Marshal(policy)
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["attestation.yaml"] = string(out)
	cm.Data["continuousAttestation"] = "action: none\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
