package kubeadm_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestJoinCarriesNodeRegistration: the taints and kubelet arguments the
// bootstrapper gets (--node-taints, --kubelet-arg, as Cluster API's
// attested data writes them) reach `kubeadm join`'s nodeRegistration,
// which the real `kubeadm config validate` accepts; "none" registers no
// taints, where no flag leaves kubeadm's default. What the kubelet or
// NodeRestriction would refuse is refused before kubeadm runs.
func TestJoinCarriesNodeRegistration(t *testing.T) {
	addr := testenv.HostAddress(t)
	taints, err := kubeadm.ParseTaints("dedicated=gpu:NoSchedule,example.com/maint:NoExecute")
	if err != nil {
		t.Fatal(err)
	}
	labels, err := kubeadm.ParseKubeletArg("node-labels=tier=web,node.kubernetes.io/pool=a")
	if err != nil {
		t.Fatal(err)
	}
	p := joinParams(t, addr, false)
	p.Node.Taints, p.Node.KubeletExtraArgs = taints, []kubeadm.KubeletArg{labels, {Name: "max-pods", Value: "58"}}
	path := writeJoin(t, p)
	if out, err := exec.CommandContext(t.Context(), kubeadmBin(t), "config", "validate", "--config", path).CombinedOutput(); err != nil {
		t.Fatalf("kubeadm config validate: %v\n%s", err, out)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		NodeRegistration struct {
			Taints           []corev1.Taint `json:"taints"`
			KubeletExtraArgs []struct{ Name, Value string }
		} `json:"nodeRegistration"`
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "kind: JoinConfiguration") {
			if err := yaml.Unmarshal([]byte(doc), &reg); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := reg.NodeRegistration
	if len(got.Taints) != 2 || got.Taints[0].Key != "dedicated" || got.Taints[0].Value != "gpu" || got.Taints[1].Effect != corev1.TaintEffectNoExecute {
		t.Errorf("taints %+v", got.Taints)
	}
	args := map[string]string{}
	for _, a := range got.KubeletExtraArgs {
		args[a.Name] = a.Value
	}
	if args["node-labels"] != "tier=web,node.kubernetes.io/pool=a" || args["max-pods"] != "58" || args["node-ip"] != addr {
		t.Errorf("kubelet args %v", args)
	}

	none, err := kubeadm.ParseTaints(kubeadm.NoTaints)
	if err != nil || none == nil || len(none) != 0 {
		t.Fatalf("ParseTaints(%q) = %v, %v; want an empty list", kubeadm.NoTaints, none, err)
	}
	p = joinParams(t, addr, true)
	p.Node.Taints = none
	config, _, err := p.Render()
	if err != nil || !strings.Contains(string(config), "taints: []") {
		t.Fatalf("no taints: %v\n%s", err, config)
	}

	for _, bad := range []struct {
		taints string
		arg    string
		names  string
	}{
		{arg: "node-labels=node-role.kubernetes.io/control-plane=", names: "node-role.kubernetes.io/control-plane"},
		{arg: "node-labels=kubernetes.io/role=admin", names: "kubernetes.io/role"},
		{arg: "node-ip=10.9.9.9", names: "node-ip"},
		{arg: "kubeconfig=/tmp/evil", names: "kubeconfig"},
		{arg: "max-pods=5 --anonymous-auth=true", names: "max-pods"},
		{taints: "a:Evict", names: "a:Evict"},
		{taints: "a=b", names: "a=b"},
	} {
		var err error
		var taints []corev1.Taint
		var args []kubeadm.KubeletArg
		if bad.taints != "" {
			taints, err = kubeadm.ParseTaints(bad.taints)
		} else {
			var a kubeadm.KubeletArg
			if a, err = kubeadm.ParseKubeletArg(bad.arg); err == nil {
				args = append(args, a)
			}
		}
		if err == nil {
			p := joinParams(t, addr, false)
			p.Node.Taints, p.Node.KubeletExtraArgs = taints, args
			_, _, err = p.Render()
		}
		if err == nil || !strings.Contains(err.Error(), bad.names) {
			t.Errorf("%q%q: %v, want a refusal naming %s", bad.taints, bad.arg, err, bad.names)
		}
	}
}
