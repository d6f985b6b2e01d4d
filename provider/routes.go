package provider

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/netroutes"
)

// Routes: the upstream route controller decides which pod CIDR goes to
// which Node; this file turns its calls into owned kernel routes
// "<podCIDR> via <node InternalIP> dev <bridge> proto <protocol>" through a
// netroutes.Manager. The decisions (which gateway, which Node a route
// belongs to, which pod CIDRs may be routed at all: podcidr.go) are pure
// functions; the methods only do the I/O.
//
// One libvirt host serves one cluster, so the clusterName argument of every
// method is ignored.

// routeTable is what the provider needs from the kernel's routes.
// *netroutes.Manager satisfies it.
type routeTable interface {
	// Subnets are the bridge's global subnets: next hops must be on them.
	Subnets() ([]netip.Prefix, error)
	// Connected are the subnets of every address on every link of the
	// host: no pod CIDR may overlap one.
	Connected() ([]netip.Prefix, error)
	// List returns the owned routes only.
	List() ([]netroutes.Route, error)
	// Ensure makes r the only owned route to r.Dst, writing nothing if it is.
	Ensure(r netroutes.Route) error
	// Remove deletes the owned route to r.Dst via r.Gateway (any gateway if
	// unset); a missing route is not an error.
	Remove(r netroutes.Route) error
	// Reconcile makes the owned routes exactly desired.
	Reconcile(desired []netroutes.Route) (netroutes.Result, error)
}

// Event reasons on Nodes.
const (
	// EventRouteNotCreated: the Node's pod CIDR cannot be routed on the
	// bridge (the Node has no InternalIP on the bridge's subnet) or must not
	// be (podcidr.go: outside --cluster-cidr, special-purpose, connected to
	// the host, or an older Node's).
	EventRouteNotCreated = "RouteNotCreated"
)

// nodeCacheTimeout bounds how long ListRoutes waits for the Node cache: an
// unsynced cache would make every route look orphaned.
const nodeCacheTimeout = 30 * time.Second

var errNoRoute = errors.New("no route")

type routes struct {
	bridge  string
	table   routeTable
	cluster []netip.Prefix // --cluster-cidr: pod CIDRs must lie inside
	// otherHost says whether a Node runs on another hypervisor host; nil
	// with hypervisors on one host. Such a Node with no address on this
	// bridge (hosts on separate segments) is routed by its own host's
	// replica, and for the LAN by BGP: this host writes nothing for it.
	otherHost func(*v1.Node) bool

	// Set by start.
	nodes    corelisters.NodeLister
	synced   cache.InformerSynced
	recorder record.EventRecorder
}

var _ cloudprovider.Routes = (*routes)(nil)

// newRoutes programs routes in the CCM's own network namespace, to pod
// CIDRs inside clusterCIDRs only. A bridge that does not exist is an error
// naming it: the CCM must not start pretending to route.
func newRoutes(cfg RoutesConfig, clusterCIDRs []netip.Prefix, _ []Hypervisor) (*routes, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("routes: netlink handle: %w", err)
	}
	m, err := netroutes.New(h, netroutes.Config{
		Bridge:   cfg.Bridge,
		Protocol: netlink.RouteProtocol(cfg.Protocol),
		Table:    cfg.Table,
		Metric:   cfg.Metric,
	})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("routes.bridge: %w", err)
	}
	return &routes{bridge: cfg.Bridge, table: m, cluster: slices.Clone(clusterCIDRs)}, nil
}

// start wires the Node lister (registered with informers, which the caller
// starts) and the recorder of Node events.
func (r *routes) start(_ context.Context, _ kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	inf := factory.Core().V1().Nodes()
	r.nodes = inf.Lister()
	r.synced = inf.Informer().HasSynced
	r.recorder = recorder
	return nil
}

// ListRoutes returns labcloud's routes on the bridge, each with the Node
// whose InternalIP is its gateway. A route no Node claims, or one that
// CreateRoute would now refuse, comes back as a blackhole, which the route
// controller deletes. The controller never deletes a route outside the
// cluster CIDR, so ListRoutes removes such an owned route itself (written by
// an older CCM, or before --cluster-cidr changed): it could only capture
// traffic that is not a pod's.
func (r *routes) ListRoutes(ctx context.Context, _ string) ([]*cloudprovider.Route, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	owned, err := r.table.List()
	if err != nil {
		return nil, fmt.Errorf("list routes on bridge %s: %w", r.bridge, err)
	}
	var connected []netip.Prefix
	if len(owned) > 0 {
		if connected, err = r.table.Connected(); err != nil {
			return nil, fmt.Errorf("list routes on bridge %s: %w", r.bridge, err)
		}
	}
	listed, stray := cloudRoutes(owned, nodes, podCIDRRules{cluster: r.cluster, connected: connected})
	if r.otherHost != nil {
		subnets, err := r.table.Subnets()
		if err != nil {
			return nil, fmt.Errorf("list routes on bridge %s: %w", r.bridge, err)
		}
		listed = append(listed, routedElsewhere(nodes, subnets, r.otherHost, podCIDRRules{cluster: r.cluster, connected: connected})...)
	}
	logger := klog.FromContext(ctx)
	for _, s := range stray {
		// Logged, not returned: an error would stop every other route's reconcile.
		if err := r.table.Remove(s.route); err != nil {
			logger.Error(err, "Could not remove a route outside the cluster CIDR", "route", s.route, "bridge", r.bridge, "reason", s.reason)
			continue
		}
		logger.Info("Removed a route outside the cluster CIDR, which the route controller never deletes", "route", s.route, "bridge", r.bridge, "reason", s.reason)
	}
	return listed, nil
}

// CreateRoute routes route.DestinationCIDR via the Node's InternalIP on the
// bridge's subnet. The addresses come from route.TargetNodeAddresses, then
// from the Node cache. It writes nothing when the route exists. A pod CIDR
// that must not be routed (podCIDRRules) or a Node with no usable address
// gets a Warning event and an error naming the Node, the CIDR and why.
func (r *routes) CreateRoute(ctx context.Context, _ string, nameHint string, route *cloudprovider.Route) error {
	name := string(route.TargetNode)
	logger := klog.FromContext(ctx).WithValues("node", name, "podCIDR", route.DestinationCIDR, "bridge", r.bridge)
	subnets, err := r.table.Subnets()
	if err != nil {
		return fmt.Errorf("route for node %s: %w", name, err)
	}
	connected, err := r.table.Connected()
	if err != nil {
		return fmt.Errorf("route for node %s: %w", name, err)
	}
	// Every Node, for the claims of others to the same CIDR.
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return fmt.Errorf("route for node %s: %w", name, err)
	}
	cached := nodeNamed(nodes, name)
	if cached != nil && r.otherHost != nil && r.otherHost(cached) && !onSubnets(cached, subnets) {
		logger.V(2).Info("Route left to the Node's own host: it has no address on this bridge")
		return nil
	}
	want, problem := planRoute(routeFacts{subnets: subnets, rules: podCIDRRules{cluster: r.cluster, connected: connected}, nodes: nodes}, route)
	if problem != nil {
		err := fmt.Errorf("%w on bridge %s for %s", errNoRoute, r.bridge, problem)
		r.warn(name, types.UID(nameHint), cached, err.Error())
		return err
	}
	if err := r.table.Ensure(want); err != nil {
		return fmt.Errorf("route for node %s: %w", name, err)
	}
	logger.V(2).Info("Route in place", "gateway", want.Gateway)
	return nil
}

// DeleteRoute removes a route ListRoutes returned (named "<dst> via <gw>").
// A route without such a name removes every owned route to its destination.
// A route that is already gone is not an error.
func (r *routes) DeleteRoute(ctx context.Context, _ string, route *cloudprovider.Route) error {
	target, err := routeToDelete(route)
	if err != nil {
		return err
	}
	if err := r.table.Remove(target); err != nil {
		return fmt.Errorf("route %s of node %q: %w", target, route.TargetNode, err)
	}
	klog.FromContext(ctx).V(2).Info("Route removed", "route", target, "node", route.TargetNode, "bridge", r.bridge)
	return nil
}

// listNodes returns the cached Nodes, waiting (bounded) for the cache to
// sync: resolving routes against an empty cache would orphan them all.
func (r *routes) listNodes(ctx context.Context) ([]*v1.Node, error) {
	if r.nodes == nil {
		return nil, errors.New("routes: Node cache not started (Initialize was not called)")
	}
	if !r.synced() {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, nodeCacheTimeout, true,
			func(context.Context) (bool, error) { return r.synced(), nil })
		if err != nil {
			return nil, fmt.Errorf("routes: Node cache not synced: %w", err)
		}
	}
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("routes: list Nodes: %w", err)
	}
	return nodes, nil
}

// warn records a Warning event on the Node.
func (r *routes) warn(name string, uid types.UID, cached *v1.Node, msg string) {
	if r.recorder == nil {
		return
	}
	ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: name, UID: uid}
	if cached != nil {
		ref.UID = cached.UID
	}
	r.recorder.Event(ref, v1.EventTypeWarning, EventRouteNotCreated, msg)
}

// routeFacts are the values CreateRoute decides from.
type routeFacts struct {
	subnets []netip.Prefix // the bridge's: a next hop must be on one
	rules   podCIDRRules
	nodes   []*v1.Node // the Node cache: the target's addresses, others' claims
}

// planRoute is CreateRoute's decision: nothing for a pod CIDR that must not
// be routed (podCIDRRules.refusal); else the route via the first InternalIP
// on a bridge subnet of the CIDR's family, looked for in the route's
// addresses and then in the cached Node's. It reuses netroutes.Desired, so
// CreateRoute and a full reconcile agree.
func planRoute(f routeFacts, route *cloudprovider.Route) (netroutes.Route, *netroutes.Problem) {
	name := string(route.TargetNode)
	dst, err := netip.ParsePrefix(route.DestinationCIDR)
	if err != nil {
		return netroutes.Route{}, &netroutes.Problem{Node: name, Reason: fmt.Sprintf("pod CIDR %q: %v", route.DestinationCIDR, err)}
	}
	dst = dst.Masked()
	if why := f.rules.judge(f.nodes).refusal(name, dst); why != "" {
		return netroutes.Route{}, &netroutes.Problem{Node: name, PodCIDR: dst, Reason: why}
	}
	cached := nodeNamed(f.nodes, name)
	addrs := internalIPs(route.TargetNodeAddresses)
	if cached != nil {
		for _, a := range internalIPs(cached.Status.Addresses) {
			if !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	want, problems := netroutes.Desired(f.subnets, []netroutes.Node{{Name: name, PodCIDRs: []netip.Prefix{dst}, Addresses: addrs}})
	if len(problems) > 0 {
		return netroutes.Route{}, &problems[0]
	}
	if len(want) != 1 { // Desired gives one route or one problem per CIDR
		return netroutes.Route{}, &netroutes.Problem{Node: name, PodCIDR: dst, Reason: "no route could be derived"}
	}
	return want[0], nil
}

// routedElsewhere are the routes ListRoutes reports for Nodes on other
// hosts with no address on this bridge's subnets: each pod CIDR the rules
// allow, routed on the Node's own host (a name that is no "<dst> via <gw>",
// so DeleteRoute removes nothing here for it).
func routedElsewhere(nodes []*v1.Node, subnets []netip.Prefix, otherHost func(*v1.Node) bool, rules podCIDRRules) []*cloudprovider.Route {
	claims := rules.judge(nodes)
	var out []*cloudprovider.Route
	for _, n := range nodes {
		if !otherHost(n) || onSubnets(n, subnets) {
			continue
		}
		for _, cidr := range podCIDRsOf(n) {
			if claims.refusal(n.Name, cidr) == "" {
				out = append(out, &cloudprovider.Route{Name: cidr.String() + " on the host of " + n.Name, TargetNode: types.NodeName(n.Name), DestinationCIDR: cidr.String()})
			}
		}
	}
	return out
}

// onSubnets says whether one of n's InternalIPs lies on one of subnets.
func onSubnets(n *v1.Node, subnets []netip.Prefix) bool {
	for _, a := range internalIPs(n.Status.Addresses) {
		for _, p := range subnets {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

// strayRoute is an owned route that ListRoutes removes itself.
type strayRoute struct {
	route  netroutes.Route
	reason string
}

// cloudRoutes is ListRoutes' decision: each owned route with the Node whose
// InternalIP is its gateway. When several Nodes share that address, the one
// claiming the destination wins, else the first by name. A gateway that is
// no Node's InternalIP, or a destination that rules refuse for that Node,
// makes the route a blackhole. With cluster CIDRs known, a route the route
// controller would never delete (outside them) is not listed but returned
// as stray. Without cluster CIDRs nothing is refused: the route controller
// does not run then.
func cloudRoutes(owned []netroutes.Route, nodes []*v1.Node, rules podCIDRRules) (listed []*cloudprovider.Route, stray []strayRoute) {
	judge := len(rules.cluster) > 0
	var judged podCIDRClaims
	if judge {
		judged = rules.judge(nodes)
	}
	nodes = slices.SortedFunc(slices.Values(nodes), func(a, b *v1.Node) int { return cmp.Compare(a.Name, b.Name) })
	byIP := map[netip.Addr][]*v1.Node{}
	for _, n := range nodes {
		for _, a := range internalIPs(n.Status.Addresses) {
			if !slices.Contains(byIP[a], n) {
				byIP[a] = append(byIP[a], n)
			}
		}
	}
	listed = make([]*cloudprovider.Route, 0, len(owned))
	for _, o := range owned {
		cr := &cloudprovider.Route{Name: routeName(o), DestinationCIDR: o.Dst.String()}
		var target string
		if candidates := byIP[o.Gateway.Unmap()]; len(candidates) > 0 {
			target = candidates[0].Name
			if i := slices.IndexFunc(candidates, func(n *v1.Node) bool { return claims(n, o.Dst) }); i >= 0 {
				target = candidates[i].Name
			}
		}
		why := ""
		if judge {
			why = judged.refusal(target, o.Dst)
		}
		switch {
		case why != "" && !controllerDeletes(o.Dst, rules.cluster):
			stray = append(stray, strayRoute{route: o, reason: why})
			continue
		case target == "" || why != "":
			cr.Blackhole = true
		default:
			cr.TargetNode = types.NodeName(target)
		}
		listed = append(listed, cr)
	}
	return listed, stray
}

// routeToDelete is DeleteRoute's decision: the exact route named by
// ListRoutes, or any owned route to the destination.
func routeToDelete(route *cloudprovider.Route) (netroutes.Route, error) {
	if r, ok := parseRouteName(route.Name); ok {
		return r, nil
	}
	dst, err := netip.ParsePrefix(route.DestinationCIDR)
	if err != nil {
		return netroutes.Route{}, fmt.Errorf("delete route %q of node %q: destination: %w", route.Name, route.TargetNode, err)
	}
	return netroutes.Route{Dst: dst.Masked()}, nil
}

// routeName names a route as `ip route` shows it: "<dst> via <gateway>".
func routeName(r netroutes.Route) string { return r.String() }

func parseRouteName(name string) (netroutes.Route, bool) {
	d, g, ok := strings.Cut(name, " via ")
	if !ok {
		return netroutes.Route{}, false
	}
	dst, err1 := netip.ParsePrefix(d)
	gw, err2 := netip.ParseAddr(g)
	if err1 != nil || err2 != nil || dst != dst.Masked() {
		return netroutes.Route{}, false
	}
	return netroutes.Route{Dst: dst, Gateway: gw.Unmap()}, true
}

// internalIPs are the parseable InternalIP addresses, in order.
func internalIPs(addrs []v1.NodeAddress) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Type != v1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// claims reports whether dst is one of the Node's pod CIDRs.
func claims(n *v1.Node, dst netip.Prefix) bool { return slices.Contains(podCIDRsOf(n), dst) }

// nodeNamed is the Node called name in nodes, or nil.
func nodeNamed(nodes []*v1.Node, name string) *v1.Node {
	if i := slices.IndexFunc(nodes, func(n *v1.Node) bool { return n.Name == name }); i >= 0 {
		return nodes[i]
	}
	return nil
}
