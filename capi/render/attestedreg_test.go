package render

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// registrationOf reads the node registration the bootstrapper gets from
// attested data's environment file, with the bootstrapper's own parsers.
func registrationOf(t *testing.T, format bootstrapv1.Format, data []byte) (taints []corev1.Taint, args []kubeadm.KubeletArg) {
	t.Helper()
	a := bootstrapperArgsOf(t, format, data)
	for i := 0; i+1 < len(a); i++ {
		switch a[i] {
		case "--node-taints":
			var err error
			if taints, err = kubeadm.ParseTaints(a[i+1]); err != nil {
				t.Fatal(err)
			}
		case "--kubelet-arg":
			ka, err := kubeadm.ParseKubeletArg(a[i+1])
			if err != nil {
				t.Fatal(err)
			}
			args = append(args, ka)
		}
	}
	return taints, args
}

// TestAttestedNodeRegistration: an attested join's node registration
// (taints, kubelet arguments, node labels among them) reaches the
// bootstrapper's flags exactly, in both formats, for workers and control
// planes; an empty taint list stays "none" (not kubeadm's default). What
// the kubelet or NodeRestriction would refuse (a label in the
// kubernetes.io namespace outside the kubelet's, a bad taint, an argument
// the bootstrapper owns, a character the environment file cannot carry)
// and every joinConfiguration field attested mode does not carry is
// refused with ErrAttestedSpec, naming it.
func TestAttestedNodeRegistration(t *testing.T) {
	taints := []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule},
		{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoExecute}}
	args := []cabpkv1.Arg{
		{Name: "node-labels", Value: ptr.To("tier=web,node.kubernetes.io/pool=a,topology.kubernetes.io/zone=z1,example.com/empty=")},
		{Name: "max-pods", Value: ptr.To("58")},
		{Name: "eviction-hard", Value: ptr.To("memory.available<100Mi")},
		{Name: "system-reserved", Value: ptr.To("cpu=500m,memory=1Gi")},
	}
	want := make([]kubeadm.KubeletArg, 0, len(args))
	for _, a := range args {
		want = append(want, kubeadm.KubeletArg{Name: a.Name, Value: *a.Value})
	}
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for _, cp := range []bool{false, true} {
			in := attestedJoin(format, "10.0.0.9:9090")
			in.ControlPlane = cp
			in.Spec.JoinConfiguration.NodeRegistration = cabpkv1.NodeRegistrationOptions{Taints: ptr.To(taints), KubeletExtraArgs: args}
			data, err := Render(in)
			if err != nil {
				t.Fatalf("%s control plane %v: %v", format, cp, err)
			}
			gotTaints, gotArgs := registrationOf(t, format, data)
			if !slices.EqualFunc(gotTaints, taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) ||
				!slices.Equal(gotArgs, want) {
				t.Fatalf("%s control plane %v: taints %v, kubelet args %v; want %v, %v", format, cp, gotTaints, gotArgs, taints, want)
			}
			if len(data) > maxAttestedDataSize {
				t.Errorf("%s: %d bytes of attested data, over %d", format, len(data), maxAttestedDataSize)
			}
		}
		in := attestedJoin(format, "10.0.0.9:9090")
		in.Spec.JoinConfiguration.NodeRegistration.Taints = ptr.To([]corev1.Taint{})
		data, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := registrationOf(t, format, data); got == nil || len(got) != 0 {
			t.Fatalf("%s: taints: [] became %v, want an empty list", format, got)
		}
		if got, _ := registrationOf(t, format, mustRender(t, attestedJoin(format, "10.0.0.9:9090"))); got != nil {
			t.Fatalf("%s: no taints given became %v, want kubeadm's default (no flag)", format, got)
		}
	}

	refused := []struct {
		name  string
		reg   func(*cabpkv1.JoinConfiguration)
		names string
	}{
		{"node-role label", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "node-labels", Value: ptr.To("tier=web,node-role.kubernetes.io/worker=")}}
		}, `label "node-role.kubernetes.io/worker"`},
		{"k8s.io label", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "node-labels", Value: ptr.To("x.k8s.io/admin=true")}}
		}, `label "x.k8s.io/admin"`},
		{"label value", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "node-labels", Value: ptr.To("tier=-web")}}
		}, `label "tier"`},
		{"taint effect", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.Taints = &[]corev1.Taint{{Key: "a", Effect: "Evict"}}
		}, `taints[0] "a:Evict"`},
		{"taint key", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.Taints = &[]corev1.Taint{{Key: "a b", Effect: corev1.TaintEffectNoSchedule}}
		}, `taints[0]`},
		{"owned kubelet arg", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "node-ip", Value: ptr.To("10.9.9.9")}}
		}, "node-ip is set by gatehouse-bootstrapper"},
		{"register-with-taints", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "register-with-taints", Value: ptr.To("a:NoSchedule")}}
		}, "register-with-taints is set by"},
		{"value with a quote", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "max-pods", Value: ptr.To("5\"\nEVIL=1")}}
		}, "kubeletExtraArgs[0] max-pods"},
		{"value with a space", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "max-pods", Value: ptr.To("5 --anonymous-auth=true")}}
		}, "kubeletExtraArgs[0] max-pods"},
		{"value with jinja", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "max-pods", Value: ptr.To("{{ v1.local_hostname }}")}}
		}, "kubeletExtraArgs[0] max-pods"},
		{"flag name", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.KubeletExtraArgs = []cabpkv1.Arg{{Name: "--max-pods", Value: ptr.To("5")}}
		}, `name "--max-pods"`},
		{"node name", func(j *cabpkv1.JoinConfiguration) { j.NodeRegistration.Name = "n1" },
			"spec.joinConfiguration.nodeRegistration.name"},
		{"cri socket and preflight", func(j *cabpkv1.JoinConfiguration) {
			j.NodeRegistration.CRISocket = "unix:///run/crio.sock"
			j.NodeRegistration.IgnorePreflightErrors = []string{"all"}
		}, "spec.joinConfiguration.nodeRegistration.criSocket, spec.joinConfiguration.nodeRegistration.ignorePreflightErrors"},
		{"discovery", func(j *cabpkv1.JoinConfiguration) { j.Discovery.BootstrapToken.APIServerEndpoint = "10.0.0.1:6443" },
			"spec.joinConfiguration.discovery"},
		{"skip phases", func(j *cabpkv1.JoinConfiguration) { j.SkipPhases = []string{"preflight"} },
			"spec.joinConfiguration.skipPhases"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
				in := attestedJoin(format, "10.0.0.9:9090")
				tc.reg(&in.Spec.JoinConfiguration)
				data, err := Render(in)
				if !errors.Is(err, ErrAttestedSpec) || !strings.Contains(err.Error(), tc.names) {
					t.Fatalf("%s: %v (data %d bytes), want ErrAttestedSpec naming %s", format, err, len(data), tc.names)
				}
			}
		})
	}
}

func mustRender(t *testing.T, in Input) []byte {
	t.Helper()
	data, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestAttestedInitConfigurationRefused: an attested init machine takes its
// configuration from `gatehouse init`, so a spec's initConfiguration or
// clusterConfiguration would never reach it: each set field is refused
// with ErrAttestedSpec, naming it, in both formats; a spec setting
// neither renders.
func TestAttestedInitConfigurationRefused(t *testing.T) {
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		in := attestedJoin(format)
		in.Role = RoleInit
		if _, err := Render(in); err != nil {
			t.Fatalf("%s: an attested init machine without kubeadm configuration: %v", format, err)
		}
		in.Spec.InitConfiguration.NodeRegistration.Name = "cp-0"
		in.Spec.ClusterConfiguration.APIServer.ExtraArgs = []cabpkv1.Arg{{Name: "audit-log-path", Value: ptr.To("-")}}
		_, err := Render(in)
		if !errors.Is(err, ErrAttestedSpec) {
			t.Fatalf("%s: %v, want ErrAttestedSpec", format, err)
		}
		for _, field := range []string{"spec.initConfiguration.nodeRegistration.name", "spec.clusterConfiguration.apiServer"} {
			if !strings.Contains(err.Error(), field) {
				t.Errorf("%s: %v does not name %s", format, err, field)
			}
		}
	}
}
