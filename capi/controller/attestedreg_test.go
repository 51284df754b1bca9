package controller_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/render"
)

// TestAttestedNodeRegistrationReachesTheMachine: an attested worker's
// joinConfiguration node registration (node labels, taints, kubelet
// arguments) reaches its data, as flags of the bootstrapper that runs
// `kubeadm join`, in both formats; a label NodeRestriction refuses a
// kubelet is refused with InvalidSpec naming it, and no data is made.
func TestAttestedNodeRegistrationReachesTheMachine(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	r := e.reconciler(controller.Config{})
	spec := func(format bootstrapv1.Format, labels string) bootstrapv1.KubeadmConfigSpec {
		return bootstrapv1.KubeadmConfigSpec{Format: format,
			Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}},
			JoinConfiguration: cabpkv1.JoinConfiguration{NodeRegistration: cabpkv1.NodeRegistrationOptions{
				Taints: &[]corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
				KubeletExtraArgs: []cabpkv1.Arg{{Name: "node-labels", Value: ptr.To(labels)},
					{Name: "max-pods", Value: ptr.To("58")}},
			}}}
	}
	for i, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		_, cfg, err := e.Machine(ctx, cluster, "worker-"+string(rune('a'+i)), false, spec(format, "tier=web,node.kubernetes.io/pool=a"))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.reconcileOnce(t, r, cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Status.DataSecretName == nil {
			t.Fatalf("%s: no data: conditions %+v", format, cfg.Status.Conditions)
		}
		files, _ := e.dataFiles(t, cfg)
		env := string(files[render.BootstrapperEnvPathFor(format)])
		for _, want := range []string{" --node-taints dedicated=gpu:NoSchedule", " --kubelet-arg node-labels=tier=web,node.kubernetes.io/pool=a",
			" --kubelet-arg max-pods=58"} {
			if !strings.Contains(env, want) {
				t.Errorf("%s: %s lacks %q:\n%s", format, render.BootstrapperEnvPathFor(format), want, env)
			}
		}
	}

	_, cfg, err := e.Machine(ctx, cluster, "worker-forbidden", false, spec(bootstrapv1.FormatCloudConfig, "tier=web,node-role.kubernetes.io/worker="))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	c := condition(cfg, controller.ConditionDataSecretAvailable)
	if c == nil || c.Reason != controller.ReasonInvalidSpec || !strings.Contains(c.Message, "node-role.kubernetes.io/worker") ||
		readyReason(cfg) != controller.ReasonInvalidSpec {
		t.Fatalf("forbidden label: condition %+v, want %s naming node-role.kubernetes.io/worker", c, controller.ReasonInvalidSpec)
	}
	if cfg.Status.DataSecretName != nil {
		t.Fatalf("data %s was made with a label the kubelet refuses", *cfg.Status.DataSecretName)
	}
}
