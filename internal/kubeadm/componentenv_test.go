package kubeadm_test

import (
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

func TestParseComponentEnv(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     kubeadm.ComponentEnv
		err      string
	}{
		{name: "GOGC of the API server", in: "kube-apiserver:GOGC=50", want: kubeadm.ComponentEnv{Component: "kube-apiserver", Name: "GOGC", Value: "50"}},
		{name: "GOMEMLIMIT of etcd", in: "etcd:GOMEMLIMIT=256MiB", want: kubeadm.ComponentEnv{Component: "etcd", Name: "GOMEMLIMIT", Value: "256MiB"}},
		{name: "GOMEMLIMIT in bytes", in: "kube-scheduler:GOMEMLIMIT=100000000", want: kubeadm.ComponentEnv{Component: "kube-scheduler", Name: "GOMEMLIMIT", Value: "100000000"}},
		{name: "no component", in: "GOGC=50", err: "is not component:NAME=value"},
		{name: "no value", in: "etcd:GOGC", err: "is not component:NAME=value"},
		{name: "unknown component", in: "kubelet:GOGC=50", err: `"kubelet": the component is none of kube-apiserver, kube-controller-manager, kube-scheduler, etcd`},
		{name: "a variable other than Go's memory settings is refused", in: "kube-apiserver:GODEBUG=tlsrsakex=1", err: `"GODEBUG" of kube-apiserver: only GOGC and GOMEMLIMIT`},
		{name: "garbage collection off is refused", in: "etcd:GOGC=off", err: "GOGC of etcd is \"off\": want a percentage from 10 to 1000"},
		{name: "GOGC too low", in: "etcd:GOGC=5", err: "want a percentage from 10 to 1000"},
		{name: "GOMEMLIMIT with an unknown unit", in: "etcd:GOMEMLIMIT=1GB", err: "want bytes with an optional"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kubeadm.ParseComponentEnv(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseComponentEnv(%q) = %v, want an error containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseComponentEnv(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestComponentEnvReachesClusterConfiguration: each component's variables
// are its extraEnvs, etcd's those of the local etcd, and a component
// without any has none.
func TestComponentEnvReachesClusterConfiguration(t *testing.T) {
	p := initParams("192.0.2.10")
	p.ControlPlaneEnv = []kubeadm.ComponentEnv{
		{Component: "kube-apiserver", Name: "GOGC", Value: "50"},
		{Component: "etcd", Name: "GOGC", Value: "60"},
		{Component: "etcd", Name: "GOMEMLIMIT", Value: "200MiB"},
	}
	out, err := p.Render()
	if err != nil {
		t.Fatal(err)
	}
	cluster := string(out)
	for _, want := range []string{
		"apiServer:\n  certSANs:",
		"  extraEnvs:\n  - name: GOGC\n    value: \"50\"\n",
		"etcd:\n  local:\n    dataDir: /var/lib/etcd\n    extraEnvs:\n    - name: GOGC\n      value: \"60\"\n    - name: GOMEMLIMIT\n      value: 200MiB\n",
	} {
		if !strings.Contains(cluster, want) {
			t.Errorf("configuration lacks %q:\n%s", want, cluster)
		}
	}
	if n := strings.Count(cluster, "extraEnvs:"); n != 2 {
		t.Errorf("%d extraEnvs, want the API server's and etcd's:\n%s", n, cluster)
	}

	p.ControlPlaneEnv = append(p.ControlPlaneEnv, kubeadm.ComponentEnv{Component: "etcd", Name: "GOGC", Value: "70"})
	if _, err := p.Render(); err == nil || !strings.Contains(err.Error(), "GOGC of etcd is set twice") {
		t.Errorf("a variable set twice: %v", err)
	}
}
