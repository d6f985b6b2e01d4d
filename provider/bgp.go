package provider

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/bgp"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// bgpAnnouncer keeps the BGP speaker's routes equal to the pod CIDRs of
// the Nodes on this replica's host. Every replica runs one from start-up,
// leader or not: a host's routes come from the replica on that host, so a
// lost host takes only its own Nodes' routes with it, and a restarted CCM
// announces again without waiting for the leader lease. It owns the
// speaker, stopped gracefully when the CCM stops, so that peers keep every
// route while it restarts.
type bgpAnnouncer struct {
	opts    bgp.Options
	cluster []netip.Prefix      // --cluster-cidr: the only CIDRs announced
	onHost  func(*v1.Node) bool // whether a Node runs on this replica's host
	// connected are the subnets of the host's addresses, which no pod CIDR
	// announced may overlap: the router would send their traffic to a Node.
	connected func() ([]netip.Prefix, error)
	nodes     corelisters.NodeLister
	synced    []cache.InformerSynced
	changed   follow.Kicker // a pending recompute
	// vips, in routed mode (bgp.announceVIPs), read which node answers
	// each VIP of the Services this CCM serves, as far as trustedAnswers
	// believes the conditions; nil otherwise.
	vips *claimReader
}

func newBGPAnnouncer(cfg *Config, cluster []netip.Prefix) (*bgpAnnouncer, error) {
	opts, err := cfg.BGP.SpeakerOptions()
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("bgp: netlink: %w", err)
	}
	connected := func() ([]netip.Prefix, error) { return netroutes.Connected(h) }
	return &bgpAnnouncer{opts: opts, cluster: cluster, onHost: cfg.onThisHost(), connected: connected, changed: follow.NewKicker()}, nil
}

// start starts a in this replica, leader or not, on the replica's own
// informers (replicaInformers): nodes, and in routed mode (vips not nil)
// the Services, whose VIPs it announces as their conditions place them.
func (a *bgpAnnouncer) start(ctx context.Context, nodes coreinformers.NodeInformer, vips *announcedSource) error {
	a.nodes, a.synced = nodes.Lister(), []cache.InformerSynced{nodes.Informer().HasSynced}
	if _, err := onRouteFieldsChange(nodes.Informer(), a.changed.Kick); err != nil {
		return err
	}
	if vips != nil {
		a.vips = vips.reader()
		a.synced = append(a.synced, vips.synced...)
		if _, err := a.vips.OnChange(a.changed.Kick); err != nil {
			return err
		}
	}
	speaker, err := bgp.Start(ctx, a.opts)
	if err != nil {
		return err
	}
	go a.run(ctx, speaker)
	return nil
}

// replicaInformers are the informers every replica runs from start-up,
// leader or not, on the CCM's client from before it leads (the shared
// informers start only in the leader): the Nodes, for BGP and for routes
// on the replica's own host; the Services, for the answers on it.
func replicaInformers(client kubernetes.Interface) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(TrimForCache))
}

// onRouteFieldsChange calls changed when a Node comes or goes, or an
// update changes what routes are made of (routeFieldsChanged).
func onRouteFieldsChange(nodes cache.SharedIndexInformer, changed func()) (cache.ResourceEventHandlerRegistration, error) {
	return nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(old, cur any) {
			o, okOld := old.(*v1.Node)
			c, okCur := cur.(*v1.Node)
			if !okOld || !okCur || routeFieldsChanged(o, c) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
}

// routeFieldsChanged says whether an update changed what bgpRoutes reads
// of a Node (its pod CIDRs, InternalIPs and zone, which says whose host
// it is on); status heartbeats do not.
func routeFieldsChanged(old, cur *v1.Node) bool {
	return !slices.Equal(podCIDRsOf(old), podCIDRsOf(cur)) || !slices.Equal(internalIPs(old.Status.Addresses), internalIPs(cur.Status.Addresses)) ||
		old.Labels[v1.LabelTopologyZone] != cur.Labels[v1.LabelTopologyZone]
}

// bgpRetry is the wait before announcing again after a failure.
const bgpRetry = 2 * time.Second

func (a *bgpAnnouncer) run(ctx context.Context, speaker *bgp.Speaker) {
	defer speaker.Stop(true)
	log := klog.FromContext(ctx).WithName("bgp")
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return
	}
	var lastRefused []string
	for {
		routes, refused, recheck, err := a.desired(ctx)
		if err == nil {
			var speakerRefused []string
			speakerRefused, err = speaker.Announce(routes)
			refused = append(refused, speakerRefused...)
			if !slices.Equal(refused, lastRefused) {
				for _, r := range refused {
					log.Info("Route not announced", "why", r)
				}
				lastRefused = refused
			}
		}
		retry := (<-chan time.Time)(nil)
		if err != nil {
			log.Error(err, "Could not announce the routes; retrying", "in", bgpRetry)
			retry = time.After(bgpRetry)
		} else if recheck {
			retry = time.After(bgpRetry) // a refused claim waits to be told of
		}
		select {
		case <-ctx.Done():
			return
		case <-a.changed:
		case <-retry:
		}
	}
}

// desired are the routes to announce now, and why others of this host
// are not. recheck: some claim to a VIP is refused, and its Service is
// told only if it still is in a moment.
func (a *bgpAnnouncer) desired(ctx context.Context) (routes []bgp.Route, refused []string, recheck bool, err error) {
	nodes, err := a.nodes.List(labels.Everything())
	if err != nil {
		return nil, nil, false, err
	}
	connected, err := a.connected()
	if err != nil {
		return nil, nil, false, err
	}
	routes, refused = bgpRoutes(nodes, podCIDRRules{cluster: a.cluster, connected: connected}, a.onHost)
	if a.vips != nil {
		// This host tells only of the claims it would have announced.
		var answers map[netip.Addr]lb.Answer
		answers, recheck, err = a.vips.Answers(ctx, func(ans lb.Answer) bool {
			n := nodeNamed(nodes, ans.Node)
			return n != nil && a.onHost(n)
		})
		if err != nil {
			return nil, nil, false, err
		}
		vr, vrefused := vipRoutes(answers, nodes, a.onHost)
		routes, refused = append(routes, vr...), append(refused, vrefused...)
	}
	return routes, refused, recheck, nil
}

// bgpRoutes are the routes to announce: the pod CIDRs of each Node on
// this host (onHost) that the rules allow (podCIDRRules.judge: inside
// --cluster-cidr, not special nor connected, overlapping no older Node's),
// via the Node's first InternalIP of the CIDR's family. refused says, per
// CIDR of this host left out, why.
func bgpRoutes(nodes []*v1.Node, rules podCIDRRules, onHost func(*v1.Node) bool) (routes []bgp.Route, refused []string) {
	claims := rules.judge(nodes)
	nodes = slices.SortedFunc(slices.Values(nodes), func(a, b *v1.Node) int { return cmp.Compare(a.Name, b.Name) })
	for _, n := range nodes {
		if !onHost(n) {
			continue // its own host's replica announces it
		}
		addrs := internalIPs(n.Status.Addresses)
		for _, cidr := range podCIDRsOf(n) {
			if why := claims.refusal(n.Name, cidr); why != "" {
				refused = append(refused, fmt.Sprintf("node %s pod CIDR %s: %s", n.Name, cidr, why))
				continue
			}
			i := slices.IndexFunc(addrs, func(a netip.Addr) bool { return a.Is4() == cidr.Addr().Is4() })
			if i < 0 {
				refused = append(refused, fmt.Sprintf("node %s pod CIDR %s: no %s InternalIP to route it through", n.Name, cidr, prefixFamily(cidr)))
				continue
			}
			routes = append(routes, bgp.Route{Prefix: cidr, NextHop: addrs[i]})
		}
	}
	return routes, refused
}

// vipRoutes are the routed mode's routes: each VIP the conditions place
// (trustedAnswers), as a host route via the node that answers it, if that
// node is on this host (onHost), through the node's first InternalIP of
// the VIP's family. refused says, per VIP of this host left out, why.
func vipRoutes(answers map[netip.Addr]lb.Answer, nodes []*v1.Node, onHost func(*v1.Node) bool) (routes []bgp.Route, refused []string) {
	byName := make(map[string]*v1.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	for _, a := range answers {
		n := byName[a.Node]
		if n == nil || !onHost(n) {
			continue // an unknown node's, or another host's to announce
		}
		host := netip.PrefixFrom(a.VIP, a.VIP.BitLen())
		addrs := internalIPs(n.Status.Addresses)
		i := slices.IndexFunc(addrs, func(ip netip.Addr) bool { return ip.Is4() == a.VIP.Is4() })
		if i < 0 {
			refused = append(refused, fmt.Sprintf("VIP %s: node %s has no %s InternalIP to route it through", a.VIP, n.Name, prefixFamily(host)))
			continue
		}
		routes = append(routes, bgp.Route{Prefix: host, NextHop: addrs[i]})
	}
	slices.SortFunc(routes, func(a, b bgp.Route) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	slices.Sort(refused) // logged when it changes
	return routes, refused
}
