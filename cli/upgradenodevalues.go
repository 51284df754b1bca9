package cli

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/upgrade"
	"github.com/gatehouse-dev/gatehouse/upgrade/nodevalues"
)

// nodeValuesFlags are upgrade apply's flags for new node software's
// reference values (docs/upgrades.md, "When the node software's
// measurements change").
type nodeValuesFlags struct {
	file, key, stateFile string
	evidencePort         int
}

// enabled says whether --node-values was given.
func (f nodeValuesFlags) enabled() bool { return f.file != "" }

// load reads and verifies the signed reference values.
func (f nodeValuesFlags) load(ctx context.Context) (signedvalues.Values, error) {
	if f.key == "" {
		return signedvalues.Values{}, errors.New("--node-values needs --node-values-key: the public key the values were signed with (gatehouse image keygen wrote it)")
	}
	data, err := os.ReadFile(f.file)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("--node-values: %w", err)
	}
	keyPEM, err := os.ReadFile(f.key)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("--node-values-key: %w", err)
	}
	key, err := signedvalues.ParsePublicKey(keyPEM)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("--node-values-key %s: %w", f.key, err)
	}
	v, err := signedvalues.Verify(ctx, data, key)
	if err != nil {
		return signedvalues.Values{}, fmt.Errorf("--node-values %s (nothing was changed): %w", f.file, err)
	}
	return v, nil
}

// joinPolicy reads the join policy the cluster runs: the join service
// release's joinConfig.attestation.
func joinPolicy(opts upgrade.Options) (policy.Policy, error) {
	values, err := upgrade.ReleaseValues(opts.Kubeconfig, opts.Namespace, joinServiceRelease)
	if err != nil {
		return policy.Policy{}, err
	}
	jc, _ := values["joinConfig"].(map[string]any)
	text, _ := jc["attestation"].(string)
	if text == "" {
		return policy.Policy{}, fmt.Errorf("release %s has no joinConfig.attestation", joinServiceRelease)
	}
	p, err := policy.Decode([]byte(text))
	if err != nil {
		return policy.Policy{}, fmt.Errorf("release %s's joinConfig.attestation: %w", joinServiceRelease, err)
	}
	return p, nil
}

// setJoinPolicy makes p the join policy: a Helm upgrade of the join
// service release's values only (its chart stays; backups first). The
// join service reloads the policy from its ConfigMap.
func setJoinPolicy(ctx context.Context, opts upgrade.Options, p policy.Policy) error {
	text, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	values := opts
	values.Charts, values.Order, values.KeepCharts = nil, []string{joinServiceRelease}, true
	values.Values = map[string]map[string]any{joinServiceRelease: {"joinConfig": map[string]any{"attestation": string(text)}}}
	_, err = upgrade.Apply(ctx, values)
	return err
}

// acceptNodeValues makes the join policy accept v's values, before any
// node runs the software they describe.
func acceptNodeValues(ctx context.Context, opts upgrade.Options, v signedvalues.Values) error {
	p, err := joinPolicy(opts)
	if err != nil {
		return err
	}
	accepted, changed, err := nodevalues.Accept(p, v)
	if err != nil {
		return fmt.Errorf("accepting the reference values of %s %s (nothing was changed): %w", v.Image.Name, v.Image.Version, err)
	}
	if len(changed) == 0 {
		fmt.Fprintf(opts.Out, "The join policy accepts the reference values of %s %s already\n", v.Image.Name, v.Image.Version)
		return nil
	}
	fmt.Fprintf(opts.Out, "The join policy accepts the reference values of %s %s:\n", v.Image.Name, v.Image.Version)
	for _, c := range changed {
		fmt.Fprintf(opts.Out, "  %s\n", c)
	}
	return setJoinPolicy(ctx, opts, accepted)
}

// movingPolicy is the join policy with v's values accepted: the
// cluster's, or in a dry run (which accepted nothing) what the real run
// makes it.
func movingPolicy(opts upgrade.Options, v signedvalues.Values) (policy.Policy, error) {
	p, err := joinPolicy(opts)
	if err != nil || !opts.DryRun {
		return p, err
	}
	p, _, err = nodevalues.Accept(p, v)
	return p, err
}

// proofs fetches fresh evidence from every Node, verified under p with
// the cluster's node lock.
func proofs(ctx context.Context, opts upgrade.Options, f nodeValuesFlags, p policy.Policy) ([]nodevalues.Proof, error) {
	lockPCR, _, err := clusterLockPCR(f.stateFile)
	if err != nil {
		return nil, fmt.Errorf("--state-file: %w", err)
	}
	appraisal, err := p.Appraisal(time.Now, lockPCR)
	if err != nil {
		return nil, err
	}
	fetcher, err := evidenceFetcher(opts.Kubeconfig, true)
	if err != nil {
		return nil, err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	return nodeProofs(ctx, client, fetcher, appraisal, opts.Kubeconfig, f.evidencePort)
}

// nodesToReplace names the nodes whose fresh evidence proves a set v's
// values replace: they run the old node software, which a Kubernetes roll
// does not move in place (kuberoll.Options.Replace).
func nodesToReplace(ctx context.Context, opts upgrade.Options, f nodeValuesFlags, v signedvalues.Values) (map[string]string, error) {
	p, err := movingPolicy(opts, v)
	if err != nil {
		return nil, err
	}
	ps, err := proofs(ctx, opts, f, p)
	if err != nil {
		return nil, fmt.Errorf("finding the nodes that run the software %s %s replaces (nothing was moved): %w", v.Image.Name, v.Image.Version, err)
	}
	_, rep, err := nodevalues.Retire(p, v, ps)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for set, nodes := range rep.Pending {
		for _, n := range nodes {
			out[n] = "it proves " + set + ", which the reference values of " + v.Image.Name + " " + v.Image.Version + " replace"
		}
	}
	return out, nil
}

// retireNodeValues fetches fresh evidence from every Node, verified under
// the join policy, and retires the sets v's values replace that no node
// proves anymore. A node whose evidence cannot be fetched or does not
// verify retires nothing. Nodes still proving a replaced set are named:
// replace them and run again.
func retireNodeValues(ctx context.Context, opts upgrade.Options, f nodeValuesFlags, v signedvalues.Values) error {
	p, err := movingPolicy(opts, v)
	if err != nil {
		return err
	}
	ps, err := proofs(ctx, opts, f, p)
	if err != nil {
		return fmt.Errorf("nothing was retired: %w", err)
	}
	retired, rep, err := nodevalues.Retire(p, v, ps)
	if err != nil {
		return fmt.Errorf("nothing was retired: %w", err)
	}
	for _, set := range slices.Sorted(maps.Keys(rep.Pending)) {
		fmt.Fprintf(opts.Out, "Kept %s: %s still prove it (they run the software %s %s replaces): replace them (docs/upgrades.md), then run this again\n", set, strings.Join(rep.Pending[set], ", "), v.Image.Name, v.Image.Version)
	}
	if len(rep.Retired) == 0 {
		fmt.Fprintf(opts.Out, "No reference values to retire: every node of %d proves a set still needed\n", len(ps))
		return nil
	}
	verb := "Retiring"
	if opts.DryRun {
		verb = "Would retire"
	}
	fmt.Fprintf(opts.Out, "%s what no node of %d proves anymore:\n", verb, len(ps))
	for _, r := range rep.Retired {
		fmt.Fprintf(opts.Out, "  %s\n", r)
	}
	return setJoinPolicy(ctx, opts, retired)
}

// nodeProofs fetches fresh evidence from every Node's evidence endpoint
// (its InternalIP, port) at once, each verified by appraisal. Any node
// that does not answer or verify is an error naming it.
func nodeProofs(ctx context.Context, client kubernetes.Interface, fetcher atls.EvidenceFetcher, appraisal *policy.Appraisal, kubeconfig string, port int) ([]nodevalues.Proof, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var (
		mu     sync.Mutex
		proofs []nodevalues.Proof
		errs   []error
		wg     sync.WaitGroup
	)
	for _, n := range nodes.Items {
		addr := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && addr == "" {
				addr = net.JoinHostPort(a.Address, strconv.Itoa(port))
			}
		}
		if addr == "" {
			mu.Lock()
			errs = append(errs, fmt.Errorf("node %s reports no InternalIP: its evidence cannot be fetched", n.Name))
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			result, err := fetcher.Fetch(ctx, addr, []attestation.Verifier{appraisal})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, fetchError(addr, kubeconfig, fetcher, err)))
				return
			}
			proofs = append(proofs, nodevalues.Proof{Node: n.Name, Measured: result.Measurements})
		})
	}
	wg.Wait()
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return proofs, errors.Join(errs...)
}

// clusterLockPCR is what the node-lock PCR of the cluster's nodes holds,
// derived from the cluster ID in the state file, and that ID (hex). A
// missing file or one without an ID is an error wrapping fs.ErrNotExist.
func clusterLockPCR(stateFile string) ([]byte, string, error) {
	state, err := clusterconfig.ReadState(stateFile)
	if err != nil {
		return nil, "", fmt.Errorf("the cluster ID the nodes' evidence shows: %w", err)
	}
	if state.ClusterID == "" {
		return nil, "", fmt.Errorf("%s holds no cluster ID: %w", stateFile, fs.ErrNotExist)
	}
	id, err := hex.DecodeString(state.ClusterID)
	if err != nil || len(id) != keys.ClusterIDSize {
		return nil, "", fmt.Errorf("%s: cluster ID is not %d bytes of hex", stateFile, keys.ClusterIDSize)
	}
	return keys.ExpectedNodeLockPCR(id), state.ClusterID, nil
}
