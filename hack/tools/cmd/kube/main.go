// Command kube is a multi-call binary holding the Kubernetes components that
// Gatehouse tests and the local cluster run: kubelet, kubeadm, kubectl,
// kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy, all
// built from the pinned k8s.io/kubernetes module.
//
// It dispatches on the name it was started as (argv[0], as a symlink), or on
// its first argument when started as "kube": `kube kubeadm version`. One binary
// instead of seven keeps the cache and the local images about 60% smaller and
// builds faster: the components share most of their code.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream mains
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream mains
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream mains
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app"
	kubeadmerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
	_ "time/tzdata"                             // CronJob time zones, as upstream
)

// components maps a component name to the function that runs it and returns
// the process exit code, mirroring each upstream cmd/<name>/main.go.
var components = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kube-proxy":              func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kubeadm": func() int {
		kubeadmerrors.HandleError(kubeadm.Run())
		return 0
	},
	"kubectl": func() int {
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck // as upstream
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Started as "kube <component> ...": shift the component name into argv[0].
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube: unknown component %q; run as one of: %s\n", name, strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run())
}
