package provider

import (
	"context"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// With hypervisors on several hosts each replica runs on a host of its
// own, with a kernel of its own, and the route controller runs in the
// leader only. So a replica that does not lead routes its own bridge, as
// the route controller would, until it leads: then the route controller
// takes over the same routes (Cloud.Initialize stops the follower first),
// one writer at a time. Shared L2: every Node is on the bridge's subnet.

// routeFollowPeriod is how often a following replica reconciles with
// nothing changed: the route controller's period in this CCM (its main
// sets --route-reconciliation-period's default to 2 s), so that a bridge
// that lost its routes (a flap) has them back as soon on every host.
const (
	routeFollowPeriod = 2 * time.Second
	routeFollowRetry  = time.Second
)

// follow starts routing r's bridge from the cluster's Nodes (the replica's
// own informer, which the caller starts) until the returned follower is
// halted.
func (r *routes) follow(ctx context.Context, nodes coreinformers.NodeInformer) (*follow.Follower, error) {
	changed := follow.NewKicker()
	reg, err := onRouteFieldsChange(nodes.Informer(), changed.Kick)
	if err != nil {
		return nil, err
	}
	lister := nodes.Lister()
	log := klog.FromContext(ctx).WithValues("bridge", r.bridge)
	prepare := func(ctx context.Context) bool {
		if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
			return false
		}
		log.Info("Not leading: routing pod CIDRs on this host's bridge until this replica leads")
		return true
	}
	step := func(context.Context) time.Duration {
		if err := r.reconcileFrom(lister); err != nil {
			log.Error(err, "Could not route the pod CIDRs on this host's bridge; retrying", "in", routeFollowRetry)
			return routeFollowRetry // the bridge may be back in a moment
		}
		return routeFollowPeriod
	}
	return follow.Start(ctx, changed, prepare, step, func() { _ = nodes.Informer().RemoveEventHandler(reg) }), nil
}

// reconcileFrom makes the owned routes on the bridge those the Nodes call
// for: each pod CIDR that may be routed (podCIDRRules) via its Node's
// InternalIP on a bridge subnet.
func (r *routes) reconcileFrom(nodes corelisters.NodeLister) error {
	all, err := nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	subnets, err := r.table.Subnets()
	if err != nil {
		return err
	}
	connected, err := r.table.Connected()
	if err != nil {
		return err
	}
	_, err = r.table.Reconcile(followedRoutes(all, subnets, podCIDRRules{cluster: r.cluster, connected: connected}))
	return err
}

// followedRoutes are the routes a following replica keeps: netroutes.Desired
// over the pod CIDRs podCIDRRules allows.
func followedRoutes(nodes []*v1.Node, subnets []netip.Prefix, rules podCIDRRules) []netroutes.Route {
	claims := rules.judge(nodes)
	in := make([]netroutes.Node, 0, len(nodes))
	for _, n := range nodes {
		rn := netroutes.Node{Name: n.Name, Addresses: internalIPs(n.Status.Addresses)}
		for _, cidr := range podCIDRsOf(n) {
			if claims.refusal(n.Name, cidr) == "" {
				rn.PodCIDRs = append(rn.PodCIDRs, cidr)
			}
		}
		in = append(in, rn)
	}
	want, _ := netroutes.Desired(subnets, in)
	return want
}
