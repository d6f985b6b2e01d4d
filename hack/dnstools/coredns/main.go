// Command coredns is CoreDNS with only the plugins the lab's cluster DNS
// uses (the Corefile lab/dns.go writes): a small build that pulls none of
// the cloud SDKs the full plugin set needs. CoreDNS' own directive list
// keeps their order.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
)

func main() {
	coremain.Run()
}
