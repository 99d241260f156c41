// Command coredns is the test cluster's DNS server: CoreDNS built from its Go
// module with only the plugins a cluster DNS needs. CoreDNS's own main links
// about 50 plugins (cloud DNS providers, etcd, dnstap, ...); this one imports
// ten (bind, to listen on the node's bridge address only, and the rest of a
// cluster DNS: cache, errors, health, kubernetes, loadbalance, log, ready,
// reload, whoami; plus metadata, prometheus and transfer, which cache and kubernetes
// import themselves), so it builds in a fraction of the time on a small machine.
//
// It deliberately links no `forward` plugin: the test cluster must never send
// DNS queries off this machine, so names outside the cluster zones get
// REFUSED (or SERVFAIL) instead of being resolved upstream.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, each registering itself with caddy in its init().
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives lists every linked plugin in CoreDNS's canonical execution order
// (the order of its plugin.cfg / core/dnsserver/zdirectives.go). A plugin
// runs before every plugin listed after it; a linked plugin missing here
// could not be used in a Corefile (main_test.go checks the two agree).
//
// metadata, prometheus and transfer are not imported above: plugin/cache
// imports metadata and metrics (the `prometheus` directive), plugin/kubernetes
// imports metadata and transfer, so they are linked whatever main does.
// Listing them keeps `-plugins` and the usable directives the same set, and
// lets the usual `prometheus :9153` line of a cluster Corefile work.
var directives = []string{
	"metadata",
	"reload",
	"bind",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"transfer",
	"kubernetes",
	"whoami",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
