package kubeadm

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kubeadmv1beta4 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstreamv1beta4"
)

// ComponentEnv is an environment variable of one control-plane
// component's static Pod, from kubeadm's ClusterConfiguration (extraEnvs
// of apiServer, controllerManager, scheduler and etcd.local; kubeadm
// configuration reference, v1beta4). kubeadm keeps the ClusterConfiguration
// in its kubeadm-config ConfigMap, so control planes that join and
// `kubeadm upgrade` render their static Pods with it too.
//
// Only the Go runtime's memory settings may be set: GOGC (the percentage a
// heap grows by between collections, 10 to 1000) and GOMEMLIMIT (a soft
// memory limit, bytes with an optional B, KiB, MiB, GiB or TiB suffix, as
// package runtime documents). A local cluster whose nodes share one
// machine trades some CPU for memory with them; nothing else about a
// component can be changed this way.
type ComponentEnv struct {
	// Component is kube-apiserver, kube-controller-manager, kube-scheduler
	// or etcd.
	Component string
	// Name is GOGC or GOMEMLIMIT, Value its value.
	Name, Value string
}

// Control-plane components whose environment ComponentEnv sets.
const (
	componentAPIServer         = "kube-apiserver"
	componentControllerManager = "kube-controller-manager"
	componentScheduler         = "kube-scheduler"
	componentEtcd              = "etcd"
)

// etcdDataDir is kubeadm's local etcd data directory.
const etcdDataDir = "/var/lib/etcd"

var envComponents = []string{componentAPIServer, componentControllerManager, componentScheduler, componentEtcd}

var goMemLimitRE = regexp.MustCompile(`^[0-9]+(B|KiB|MiB|GiB|TiB)?$`)

// ParseComponentEnv reads a --control-plane-env value,
// component:NAME=value (e.g. kube-apiserver:GOGC=50), and checks it.
func ParseComponentEnv(s string) (ComponentEnv, error) {
	component, kv, ok := strings.Cut(s, ":")
	name, value, ok2 := strings.Cut(kv, "=")
	if !ok || !ok2 {
		return ComponentEnv{}, fmt.Errorf("control-plane environment variable %q is not component:NAME=value", s)
	}
	e := ComponentEnv{Component: component, Name: name, Value: value}
	return e, e.validate()
}

func (e ComponentEnv) validate() error {
	if !slices.Contains(envComponents, e.Component) {
		return fmt.Errorf("control-plane environment variable %s of %q: the component is none of %s", e.Name, e.Component, strings.Join(envComponents, ", "))
	}
	switch e.Name {
	case "GOGC":
		if n, err := strconv.Atoi(e.Value); err != nil || n < 10 || n > 1000 {
			return fmt.Errorf("control-plane environment variable GOGC of %s is %q: want a percentage from 10 to 1000", e.Component, e.Value)
		}
	case "GOMEMLIMIT":
		if !goMemLimitRE.MatchString(e.Value) {
			return fmt.Errorf("control-plane environment variable GOMEMLIMIT of %s is %q: want bytes with an optional B, KiB, MiB, GiB or TiB suffix", e.Component, e.Value)
		}
	default:
		return fmt.Errorf("control-plane environment variable %q of %s: only GOGC and GOMEMLIMIT may be set", e.Name, e.Component)
	}
	return nil
}

// CheckComponentEnv checks every variable of list, and that none is set
// twice for one component.
func CheckComponentEnv(list []ComponentEnv) error {
	var errs []error
	seen := map[[2]string]bool{}
	for _, e := range list {
		if err := e.validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		key := [2]string{e.Component, e.Name}
		if seen[key] {
			errs = append(errs, fmt.Errorf("control-plane environment variable %s of %s is set twice", e.Name, e.Component))
		}
		seen[key] = true
	}
	return errors.Join(errs...)
}

// componentExtraEnvs returns the extraEnvs of component in list, in order.
func componentExtraEnvs(list []ComponentEnv, component string) []kubeadmv1beta4.EnvVar {
	var out []kubeadmv1beta4.EnvVar
	for _, e := range list {
		if e.Component == component {
			out = append(out, kubeadmv1beta4.EnvVar{EnvVar: corev1.EnvVar{Name: e.Name, Value: e.Value}})
		}
	}
	return out
}

// setComponentEnv puts the variables of list into cluster.
func setComponentEnv(cluster *kubeadmv1beta4.ClusterConfiguration, list []ComponentEnv) {
	cluster.APIServer.ExtraEnvs = componentExtraEnvs(list, componentAPIServer)
	cluster.ControllerManager.ExtraEnvs = componentExtraEnvs(list, componentControllerManager)
	cluster.Scheduler.ExtraEnvs = componentExtraEnvs(list, componentScheduler)
	if env := componentExtraEnvs(list, componentEtcd); len(env) > 0 {
		// kubeadm's default data directory, which the bootstrapper keeps
		// on the state disk.
		cluster.Etcd.Local = &kubeadmv1beta4.LocalEtcd{DataDir: etcdDataDir, ExtraEnvs: env}
	}
}
