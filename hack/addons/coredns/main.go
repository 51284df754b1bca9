// Command coredns is CoreDNS of the pinned module (go.mod) with the plugins
// the local cluster's Corefile uses, kubeadm's, and a few a user may add to
// it (log, hosts, rewrite, template), in upstream's order; upstream's
// binary compiles about 1,300 packages for every plugin, this about 800
// (hack/addon-binaries.sh).
package main

import (
	"slices"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// kubeadm's Corefile (kubeadm config print init-defaults, cmd/kubeadm/app/phases/addons/dns).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	// Added to a Corefile often.
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/template"
)

func init() {
	// Upstream's order (the order plugins handle a query in), of the
	// plugins compiled in: those above and the ones they import (dnstap,
	// metadata, transfer, debug).
	registered := map[string]bool{}
	for _, name := range caddy.ListPlugins()["others"] {
		registered[strings.TrimPrefix(name, "dns.")] = true
	}
	dnsserver.Directives = slices.DeleteFunc(dnsserver.Directives, func(d string) bool { return !registered[d] })
}

func main() { coremain.Run() }
