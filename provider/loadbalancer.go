package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/api"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/lb/announce"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/placement"
)

// LoadBalancer: this file holds the cloudprovider.LoadBalancer methods.
// The allocator is the one record of which VIPs exist and which Services
// hold them (loaded from the Service statuses at start); placement (the
// placement package) decides which node answers each VIP and applies that
// to the announcer.

// Event reasons on Services, besides placement's about where a VIP is
// answered (placement.ReasonVIPAnnounced and friends).
const (
	ReasonAllocated        = "IPAllocated"
	ReasonConflict         = "IPConflict"
	ReasonExhausted        = "PoolExhausted"
	ReasonInvalidRequest   = "InvalidRequest"
	ReasonNotInPool        = "IPNotInPool"
	ReasonTaken            = "IPTaken"
	ReasonReleased         = "IPReleased"
	ReasonNotForNS         = "PoolNotForNamespace"
	ReasonNoPoolForFamily  = "NoPoolForFamily"
	ReasonDualStackPartial = "DualStackPartial" // Normal: a PreferDualStack Service goes without a family
)

// A Service waiting for an address (pool exhausted, requested address
// taken) is synced again after waitRetry, then after twice as long each
// time it waits for the same request, up to maxWaitRetry: a freed address
// is picked up within seconds by a Service that just began to wait, and
// thousands of Services waiting for good cost little.
const (
	waitRetry    = 3 * time.Second
	maxWaitRetry = 2 * time.Minute
)

type loadBalancer struct {
	bridge string
	serves func(*v1.Service) bool // whether a Service is this CCM's to serve (class)
	alloc  *lb.Allocator
	// namespaces reads a Service's namespace labels, for pools with a
	// namespaceSelector; nil when no pool has one.
	namespaces corelisters.NamespaceLister
	selectsNS  bool
	ann        placement.Announcer
	place      *placement.Placement
	role       *hostRole     // nil in unit tests: always the announcer
	loaded     chan struct{} // closed once every existing assignment is loaded

	client   kubernetes.Interface
	recorder record.EventRecorder
	services corelisters.ServiceLister // from start: the shared informer's

	mu     sync.Mutex
	warned map[string]string    // service → the request error last reported
	waits  map[string]waitState // service → how long it waits for an address now

	announcerStopped atomic.Pointer[error] // why the announcer stopped before the CCM did
	// defended is what the announcer's OnDefend reports to: l, once it
	// leads and has its recorder and Service lister; nil in unit tests.
	defended *atomic.Pointer[loadBalancer]
}

var _ cloudprovider.LoadBalancer = (*loadBalancer)(nil)

func newLoadBalancer(ctx context.Context, cfg *Config, hvs []Hypervisor, in *instances) (*loadBalancer, error) {
	bridge := cfg.LoadBalancer.Bridge
	ifi, err := net.InterfaceByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.bridge %q: %w", bridge, err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defended := new(atomic.Pointer[loadBalancer]) // set once l leads
	ann, err := announce.New(ifi, h, announce.Options{OnDefend: func(d announce.Defence) {
		if l := defended.Load(); l != nil {
			l.vipDefended(d)
		}
	}})
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.bridge %q: %w", bridge, err)
	}
	var vipRoutes placement.PathSetter
	if cfg.LoadBalancer.RoutedTraffic != RoutedAnnouncer {
		rh, err := netlink.NewHandle() // netroutes makes its handle strict
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		if vipRoutes, err = netroutes.New(rh, netroutes.Config{Bridge: bridge, Protocol: netroutes.VIPProtocol}); err != nil {
			rh.Close()
			return nil, fmt.Errorf("loadBalancer.bridge %q: %w", bridge, err)
		}
	}
	edges, err := subnetEdges(h, bridge)
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.bridge %q: %w", bridge, err)
	}
	l := newLoadBalancerWith(cfg, hvs, in, ann, vipRoutes, edges)
	l.defended = defended
	l.role = newHostRole(bridge, ann, l.alloc.InPools, cfg.resolved.here != nil)
	l.role.stand(ctx)
	go l.runAnnouncer(ctx)
	return l, nil
}

// newLoadBalancerWith builds the load balancer of cfg (loaded) over ann;
// vipRoutes, if not nil, programs the host's routes to VIPs. The pools
// never hand out the excluded addresses.
func newLoadBalancerWith(cfg *Config, hvs []Hypervisor, in *instances, ann placement.Announcer, vipRoutes placement.PathSetter, excluded []netip.Addr) *loadBalancer {
	pools, bridge := cfg.resolved.pools, cfg.LoadBalancer.Bridge
	alloc := lb.NewAllocator(pools.Excluding(excluded))
	placed := make([]placement.Hypervisor, len(hvs))
	for i, h := range hvs {
		placed[i] = h
	}
	return &loadBalancer{
		bridge:    bridge,
		serves:    cfg.LoadBalancer.Serves,
		alloc:     alloc,
		selectsNS: pools.SelectsNamespaces(),
		ann:       ann,
		place: placement.New(placement.Config{
			Bridge: bridge, Bridges: cfg.guestBridges(), Hypervisors: placed, Alloc: alloc, Announcer: ann, Here: cfg.resolved.here, VIPRoutes: vipRoutes,
			Domain: func(ctx context.Context, n *v1.Node) (libvirtcloud.Domain, error) {
				d, _, err := in.find(ctx, n)
				return d, err
			},
		}),
		loaded: make(chan struct{}),
		warned: map[string]string{},
		waits:  map[string]waitState{},
	}
}

// start runs once this replica leads: it becomes the host's announcer,
// loads every assignment, and starts the placement loop.
func (l *loadBalancer) start(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	if err := l.lead(ctx, client, factory, recorder); err != nil {
		return err
	}
	go l.serve(ctx)
	return nil
}

// lead makes placement lead, on factory's informers, and this load
// balancer the one that records what happens to the Services.
func (l *loadBalancer) lead(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	l.client = client
	l.recorder = recorder
	l.services = factory.Core().V1().Services().Lister()
	if l.selectsNS {
		l.namespaces = factory.Core().V1().Namespaces().Lister()
	}
	if err := l.place.Lead(ctx, factory, recorder, client); err != nil {
		return err
	}
	if l.defended != nil {
		l.defended.Store(l)
	}
	if l.role == nil {
		go l.runAnnouncer(ctx)
	}
	return nil
}

// serve waits for the replica that stood in (if any) to hand over the
// bridge, loads every assignment and places VIPs until ctx ends.
func (l *loadBalancer) serve(ctx context.Context) {
	if l.role != nil {
		if err := l.role.lead(ctx); err != nil {
			return
		}
	}
	if err := l.load(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot load VIP assignments; retrying")
		l.retryLoad(ctx)
	}
	l.place.Run(ctx)
}

// runAnnouncer runs the announcer until ctx ends. One that stops before
// (it cannot watch the bridge's link, say) answers no VIP on this host: the
// CCM says so once, loudly, and checkDataPath reports it from then on.
func (l *loadBalancer) runAnnouncer(ctx context.Context) {
	err := l.ann.Run(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		err = errors.New("it returned")
	}
	err = fmt.Errorf("VIP announcer on bridge %s stopped: %w", l.bridge, err)
	l.announcerStopped.Store(&err)
	klog.FromContext(ctx).Error(err, "No LoadBalancer VIP will be answered on this host until the CCM restarts")
}

// checkAnnouncer is nil while the announcer runs (or has not started yet).
func (l *loadBalancer) checkAnnouncer() error {
	if err := l.announcerStopped.Load(); err != nil {
		return *err
	}
	return nil
}

func (l *loadBalancer) retryLoad(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		if err := l.load(ctx); err == nil {
			return
		}
	}
}

// load registers every address already in a Service status before any new
// address is handed out, so that a restart never moves or duplicates one.
func (l *loadBalancer) load(ctx context.Context) error {
	log := klog.FromContext(ctx)
	list, err := l.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Services to load VIP assignments: %w", err)
	}
	n := 0
	for i := range list.Items {
		svc := &list.Items[i]
		if svc.Spec.Type != v1.ServiceTypeLoadBalancer || !l.serves(svc) {
			continue
		}
		req, err := lb.ParseRequest(svc)
		if err != nil {
			req = lb.Request{Ports: lb.PortsOf(svc.Spec.Ports)}
		}
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			ip, err := netip.ParseAddr(ing.IP)
			if err != nil {
				continue
			}
			if err := l.alloc.Assign(key(svc), ip, req); err != nil {
				log.Error(err, "Cannot keep a Service's existing VIP", "service", key(svc), "ip", ip)
				continue
			}
			n++
		}
	}
	close(l.loaded)
	log.Info("Loaded VIP assignments from Service status", "assignments", n)
	return nil
}

func key(svc *v1.Service) string { return svc.Namespace + "/" + svc.Name }

func splitKey(k string) (string, string) {
	ns, name, _ := strings.Cut(k, "/")
	return ns, name
}

func (l *loadBalancer) waitLoaded(ctx context.Context) error {
	select {
	case <-l.loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for VIP assignments to load: %w", ctx.Err())
	}
}

func status(ips []netip.Addr) *v1.LoadBalancerStatus {
	st := &v1.LoadBalancerStatus{}
	for _, ip := range ips {
		st.Ingress = append(st.Ingress, v1.LoadBalancerIngress{IP: ip.String(), IPMode: ptr.To(v1.LoadBalancerIPModeVIP)})
	}
	return st
}

// GetLoadBalancer reports the addresses the Service holds; it is false only
// once they are released, so the cleanup finalizer goes only then.
func (l *loadBalancer) GetLoadBalancer(ctx context.Context, _ string, svc *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	if err := l.waitLoaded(ctx); err != nil {
		return nil, false, err
	}
	ips := l.alloc.Lookup(key(svc))
	return status(ips), len(ips) > 0, nil
}

// GetLoadBalancerName is the upstream default name.
func (l *loadBalancer) GetLoadBalancerName(_ context.Context, _ string, svc *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(svc)
}

// EnsureLoadBalancer allocates the Service's VIP(s), makes sure no other
// host owns them, and has the placement announce them. The node list is
// not used: the placement reads the same Nodes from its own informer, so
// that this call and the failover loop always decide alike.
func (l *loadBalancer) EnsureLoadBalancer(ctx context.Context, _ string, svc *v1.Service, _ []*v1.Node) (*v1.LoadBalancerStatus, error) {
	if !l.serves(svc) {
		return nil, cloudprovider.ImplementedElsewhere
	}
	if err := l.waitLoaded(ctx); err != nil {
		return nil, err
	}
	k := key(svc)
	req, err := lb.ParseRequest(svc)
	if err != nil {
		l.warnOnce(svc, ReasonInvalidRequest, err)
		return nil, untilChanged(err)
	}
	req.NamespaceLabels = l.namespaceLabels(ctx, svc.Namespace)
	had := l.alloc.Lookup(k)
	res, err := l.alloc.Allocate(k, req)
	if err != nil {
		return nil, l.allocationFailed(svc, err)
	}
	ips := res.IPs
	if !slices.Equal(had, ips) {
		l.recorder.Eventf(svc, v1.EventTypeNormal, ReasonAllocated, "Allocated %s", joinAddrs(ips))
	}
	for _, ip := range ips {
		if err := l.claim(ctx, svc, ip); err != nil {
			return nil, err
		}
	}
	l.place.Sync(ctx, svc)
	l.succeeded(svc, res)
	return status(ips), nil
}

// succeeded forgets what was reported of svc, served now, and how long it
// waited: only success does, so a retry that fails the same way (taken,
// exhausted, conflict) does not repeat the event. A Service served without
// a family it preferred is told so once, until that changes.
func (l *loadBalancer) succeeded(svc *v1.Service, res lb.Allocation) {
	k := key(svc)
	if len(res.Skipped) == 0 {
		l.clearWarning(k)
		return
	}
	l.mu.Lock()
	delete(l.waits, k)
	l.mu.Unlock()
	l.reportOnce(svc, v1.EventTypeNormal, ReasonDualStackPartial, skippedMessage(res))
}

// skippedMessage says which families a PreferDualStack Service went
// without, and why.
func skippedMessage(res lb.Allocation) string {
	why := make([]string, len(res.Skipped))
	for i, s := range res.Skipped {
		why[i] = fmt.Sprintf("no %s address: %v", s.Family, s.Err)
	}
	return fmt.Sprintf("%s: served on %s only; %s", lb.PreferDualStack, joinAddrs(res.IPs), strings.Join(why, "; "))
}

// claim probes the bridge once for another owner of a newly allocated ip.
// Any answer is a conflict, a node's own address included (a node
// answering for the VIP as its own address would split its traffic), except
// an answer with the MAC this announcer already uses for it.
func (l *loadBalancer) claim(ctx context.Context, svc *v1.Service, ip netip.Addr) error {
	if l.alloc.Claimed(ip) {
		return nil
	}
	owner, taken, err := l.ann.Probe(ctx, ip)
	if err != nil {
		return fmt.Errorf("probe %s on %s: %w", ip, l.bridge, err)
	}
	if taken {
		metrics.IPConflicts.Inc()
		err := fmt.Errorf("%s is already answered on %s by %s: not announcing it", ip, l.bridge, owner)
		l.warnOnce(svc, ReasonConflict, err)
		return err
	}
	l.alloc.Claim(ip)
	return nil
}

// UpdateLoadBalancer re-places the Service's VIPs.
func (l *loadBalancer) UpdateLoadBalancer(ctx context.Context, _ string, svc *v1.Service, _ []*v1.Node) error {
	if !l.serves(svc) {
		return cloudprovider.ImplementedElsewhere
	}
	if err := l.waitLoaded(ctx); err != nil {
		return err
	}
	l.place.Sync(ctx, svc)
	return nil
}

// EnsureLoadBalancerDeleted releases the Service's VIPs; the placement
// stops answering for those no other Service shares.
func (l *loadBalancer) EnsureLoadBalancerDeleted(ctx context.Context, _ string, svc *v1.Service) error {
	if err := l.waitLoaded(ctx); err != nil {
		return err
	}
	k := key(svc)
	ips := l.alloc.Lookup(k)
	l.alloc.Release(k)
	l.clearWarning(k)
	if len(ips) > 0 {
		l.place.Sync(ctx, nil)
		l.recorder.Eventf(svc, v1.EventTypeNormal, ReasonReleased, "Released %s", joinAddrs(ips))
	}
	return nil
}

// waitError is an allocation that may succeed once an address is freed: it
// is an *api.RetryError, which the service controller requeues after a
// short delay, and it still unwraps to the allocator's error.
type waitError struct {
	*api.RetryError
	err error
}

func (e *waitError) Unwrap() []error { return []error{e.RetryError, e.err} }

// untilChanged is a Service's error that only a change of the Service can
// mend (a malformed annotation, a family no pool has): the service
// controller syncs a changed Service at once, so it retries the unchanged
// one only after maxWaitRetry rather than on its own shorter backoff.
func untilChanged(err error) error {
	return &waitError{RetryError: api.NewRetryError(err.Error(), maxWaitRetry), err: err}
}

// allocationFailed turns an allocator error into one event and the error
// the service controller retries on.
func (l *loadBalancer) allocationFailed(svc *v1.Service, err error) error {
	k := key(svc)
	reason := ReasonInvalidRequest
	waits, mendedByChange := false, false
	var (
		taken   *lb.IPTakenError
		notIn   *lb.NotInPoolError
		exhaust *lb.PoolExhaustedError
		ports   *lb.PortConflictError
	)
	// An exhausted family is checked first: a PreferDualStack Service that
	// got no family at all may wait for it even if the other has no pool.
	switch {
	case errors.As(err, &exhaust):
		reason, waits = ReasonExhausted, true
	case errors.As(err, &taken), errors.As(err, &ports):
		reason, waits = ReasonTaken, true
	case errors.As(err, &notIn):
		reason = ReasonNotInPool
	case errors.Is(err, lb.ErrPoolNotForNamespace):
		reason = ReasonNotForNS
	case errors.Is(err, lb.ErrNoPoolForFamily):
		reason, mendedByChange = ReasonNoPoolForFamily, true
	}
	l.warnOnce(svc, reason, err)
	err = fmt.Errorf("service %s: %w", k, err)
	switch {
	case waits:
		return &waitError{RetryError: api.NewRetryError(err.Error(), l.nextWait(svc)), err: err}
	case mendedByChange:
		return untilChanged(err)
	}
	return err
}

// waitState is how long a Service waits before its next try, and for
// which request.
type waitState struct {
	request string
	delay   time.Duration
}

// nextWait is how long svc waits before its next try: waitRetry for a
// Service that just began to wait or changed its request, else twice the
// last wait, up to maxWaitRetry.
func (l *loadBalancer) nextWait(svc *v1.Service) time.Duration {
	request := fmt.Sprint(svc.Generation, svc.Annotations[lb.AnnotationIP], svc.Annotations[lb.AnnotationPool], svc.Annotations[lb.AnnotationSharingKey])
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.waits[key(svc)]
	if !ok || w.request != request {
		w = waitState{request: request, delay: waitRetry}
	} else {
		w.delay = min(2*w.delay, maxWaitRetry)
	}
	l.waits[key(svc)] = w
	return w.delay
}

// namespaceLabels are the labels of namespace ns when a pool selects
// namespaces by label; none when no pool does. The informer's copy, or the
// API server's before the informer has synced.
func (l *loadBalancer) namespaceLabels(ctx context.Context, ns string) map[string]string {
	if l.namespaces == nil {
		return nil
	}
	n, err := l.namespaces.Get(ns)
	if err != nil {
		if n, err = l.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot read the labels of a Service's namespace; pools with a namespaceSelector will not serve it", "namespace", ns)
			return nil
		}
	}
	return n.Labels
}

// warnOnce emits a Warning event unless the same problem was reported for
// this Service already: retries must not flood the event stream.
func (l *loadBalancer) warnOnce(svc *v1.Service, reason string, err error) {
	l.reportOnce(svc, v1.EventTypeWarning, reason, err.Error())
}

// reportOnce emits an event unless it is what was last reported for this
// Service.
func (l *loadBalancer) reportOnce(svc *v1.Service, eventType, reason, msg string) {
	k := key(svc)
	l.mu.Lock()
	seen := l.warned[k] == reason+msg
	l.warned[k] = reason + msg
	l.mu.Unlock()
	if !seen {
		l.recorder.Event(svc, eventType, reason, msg)
	}
}

// clearWarning forgets what was reported of k and how long it waited.
func (l *loadBalancer) clearWarning(k string) {
	l.mu.Lock()
	delete(l.warned, k)
	delete(l.waits, k)
	l.mu.Unlock()
}

func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
