package placement

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/netroutes"
)

// Spread routes: traffic the host routes to a VIP (from other networks,
// from the host itself) goes over a /32 route whose next hops are nodes
// that may answer the VIP (up to maxSpreadPaths of them), as a cloud load
// balancer spreads over its backends; the kernel's multipath hash picks one
// per connection. ARP keeps serving the clients on the bridge itself
// through the answering node.

// PathSetter programs the host's routes to VIPs. A netroutes.Manager of
// protocol netroutes.VIPProtocol satisfies it.
type PathSetter interface {
	Subnets() ([]netip.Prefix, error)
	ReconcilePaths([]netroutes.Paths) (int, error)
	UpdatePaths([]netroutes.Paths) (int, error)
}

var _ PathSetter = (*netroutes.Manager)(nil)

// maxSpreadPaths caps the next hops of a route to a VIP: how many of its
// ranked nodes a pass keeps. A few nodes already spread connections; a next
// hop per node made a large cluster's routes kilobytes each (too long for
// `ip route` to list) and every placement pass dump and parse all of them.
const maxSpreadPaths = 16

// routeCheckInterval is how often at most a pass reads the kernel's routes
// to VIPs: in a burst of Services passes run back to back, and a read
// allocates in proportion to every VIP's multipath route, pass after pass.
// The passes between write what changed since the last; a route someone else
// changed or removed is put back by the first pass a second after the last
// read (the Resync's at the latest).
const routeCheckInterval = time.Second

// vipPaths decides the host's route to each answered VIP (answering: VIP →
// answering node; ranked: VIP → its best eligible nodes, at most
// maxSpreadPaths, in lb.Ranked's order). The next hops are the answering
// node and the VIP's other ranked nodes, or the answering node alone when a
// Service on the VIP wants ClientIP affinity (kube-proxy keeps affinity per
// node, so only one node may see a client) or when the answering node is
// not among the ranked (a VIP kept through a control-plane outage). Being
// rendezvous hashing, the ranking changes only where a node joining or
// leaving enters or leaves it. addr gives a node's address on the bridge for
// the VIP's family; a node without one is left out, and a VIP whose
// answering node has none gets no route (the host reaches it by ARP).
func vipPaths(answering map[netip.Addr]string, ranked map[netip.Addr][]string, affinity map[netip.Addr]bool, addr func(node string, vip netip.Addr) (netip.Addr, bool)) []netroutes.Paths {
	out := make([]netroutes.Paths, 0, len(answering))
	for vip, node := range answering {
		gw, ok := addr(node, vip)
		if !ok {
			continue
		}
		nodes := ranked[vip]
		p := netroutes.Paths{Dst: netip.PrefixFrom(vip, vip.BitLen()), Gateways: make([]netip.Addr, 1, 1+len(nodes))}
		p.Gateways[0] = gw
		if !affinity[vip] && slices.Contains(nodes, node) {
			for _, n := range nodes {
				if a, ok := addr(n, vip); ok && n != node {
					p.Gateways = append(p.Gateways, a)
				}
			}
		}
		// Sorted, as netroutes keeps them: it then takes them as they are.
		slices.SortFunc(p.Gateways, netip.Addr.Compare)
		out = append(out, p)
	}
	return out
}

// applySpread programs the host's routes to every VIP answered now
// (answeringMACs: the announcer's VIPs and MACs after the pass's changes, so
// a route never names a node the ARP answer has left).
func (p *Placement) applySpread(ctx context.Context, snap snapshot, answeringMACs map[netip.Addr]net.HardwareAddr) {
	if p.vipRoutes == nil {
		return
	}
	subnets, err := p.vipRoutes.Subnets()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot read the bridge's subnets for the routes to VIPs")
		return
	}
	answering := map[netip.Addr]string{}
	for vip, mac := range answeringMACs {
		if v, ok := snap.withMAC(mac); ok {
			answering[vip] = v.name
		}
	}
	affinity := map[netip.Addr]bool{}
	for vip, claim := range snap.vips {
		if claim.affinity {
			affinity[vip] = true
		}
	}
	addr := func(node string, vip netip.Addr) (netip.Addr, bool) {
		v, _ := snap.named(node)
		return bridgeAddress(v.node, subnets, vip.Is4())
	}
	write := p.vipRoutes.UpdatePaths
	if now := time.Now(); now.Sub(p.routesCheckedAt) >= routeCheckInterval {
		write, p.routesCheckedAt = p.vipRoutes.ReconcilePaths, now
	}
	if _, err := write(vipPaths(answering, snap.ranked, affinity, addr)); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot program the host's routes to VIPs")
	}
}

// bridgeAddress is n's first InternalIP of the family that lies on one of
// the bridge's subnets: the only kind of address that is a next hop there.
func bridgeAddress(n *v1.Node, subnets []netip.Prefix, v4 bool) (netip.Addr, bool) {
	if n == nil {
		return netip.Addr{}, false
	}
	for _, a := range n.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if a.Type != v1.NodeInternalIP || err != nil || ip.Unmap().Is4() != v4 {
			continue
		}
		ip = ip.Unmap()
		for _, s := range subnets {
			if s.Contains(ip) {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}
