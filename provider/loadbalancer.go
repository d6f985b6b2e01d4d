package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/lb/announce"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// Announcer makes one node answer for a VIP on the bridge.
// *announce.Announcer satisfies it.
type Announcer interface {
	Set(vip netip.Addr, mac net.HardwareAddr) error
	Remove(vip netip.Addr) error
	Probe(ctx context.Context, vip netip.Addr) (owner net.HardwareAddr, taken bool, err error)
	Run(ctx context.Context) error
}

// DomainEvents is a hypervisor's stream of domain changes.
// *libvirtcloud.Hypervisor satisfies it.
type DomainEvents interface {
	Subscribe() (<-chan libvirtcloud.Event, func())
}

// Event reasons on Services.
const (
	ReasonAllocated      = "IPAllocated"
	ReasonAnnounced      = "Announced"
	ReasonMoved          = "AnnouncerMoved"
	ReasonNoNode         = "NoEligibleNode"
	ReasonConflict       = "IPConflict"
	ReasonExhausted      = "PoolExhausted"
	ReasonInvalidRequest = "InvalidRequest"
	ReasonNotInPool      = "IPNotInPool"
	ReasonTaken          = "IPTaken"
	ReasonReleased       = "IPReleased"
)

// RetryAnnotation is bumped on a Service that waits for an address when an
// address is released, so that the service controller syncs it at once
// instead of after its back-off.
const RetryAnnotation = "lb.labcloud.io/retry"

type loadBalancer struct {
	bridge    string
	instances *instances
	events    []DomainEvents
	alloc     *lb.Allocator
	ann       Announcer
	loaded    chan struct{} // closed once every existing assignment is loaded

	client   kubernetes.Interface
	services corelisters.ServiceLister
	nodes    corelisters.NodeLister
	slices   discoverylisters.EndpointSliceLister
	synced   []cache.InformerSynced
	recorder record.EventRecorder
	kick     chan struct{}

	mu      sync.Mutex
	vips    map[netip.Addr]*vipState
	pending map[string]bool   // services waiting for an address to free up
	warned  map[string]string // service → the request error last reported
}

// vipState is what labcloud announces for one VIP.
type vipState struct {
	holders map[string]bool // service keys sharing the VIP
	node    string          // answering node; "" when none is eligible
	mac     net.HardwareAddr
	probed  bool // the bridge was probed for another owner
}

var _ cloudprovider.LoadBalancer = (*loadBalancer)(nil)

func newLoadBalancer(_ context.Context, cfg LoadBalancerConfig, hvs []Hypervisor, in *instances) (*loadBalancer, error) {
	ifi, err := net.InterfaceByName(cfg.Bridge)
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.bridge %q: %w", cfg.Bridge, err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	ann, err := announce.New(ifi, h, announce.Options{})
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.bridge %q: %w", cfg.Bridge, err)
	}
	return newLoadBalancerWith(cfg, hvs, in, ann)
}

func newLoadBalancerWith(cfg LoadBalancerConfig, hvs []Hypervisor, in *instances, ann Announcer) (*loadBalancer, error) {
	pools, err := lb.NewPools(cfg.Pools)
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.pools: %w", err)
	}
	l := &loadBalancer{
		bridge:    cfg.Bridge,
		instances: in,
		alloc:     lb.NewAllocator(pools),
		ann:       ann,
		loaded:    make(chan struct{}),
		kick:      make(chan struct{}, 1),
		vips:      map[netip.Addr]*vipState{},
		pending:   map[string]bool{},
		warned:    map[string]string{},
	}
	for _, h := range hvs {
		if e, ok := h.(DomainEvents); ok {
			l.events = append(l.events, e)
		}
	}
	return l, nil
}

func (l *loadBalancer) start(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) error {
	l.client = client
	svcInf, nodeInf, sliceInf := factory.Core().V1().Services(), factory.Core().V1().Nodes(), factory.Discovery().V1().EndpointSlices()
	l.services, l.nodes, l.slices = svcInf.Lister(), nodeInf.Lister(), sliceInf.Lister()
	l.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, nodeInf.Informer().HasSynced, sliceInf.Informer().HasSynced}
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.poke() },
		UpdateFunc: func(any, any) { l.poke() },
		DeleteFunc: func(any) { l.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{nodeInf.Informer(), sliceInf.Informer()} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return err
		}
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	l.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "libvirt-cloud-provider"})

	if err := l.load(ctx); err != nil {
		return err
	}
	go func() {
		if err := l.ann.Run(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "VIP announcer stopped")
		}
	}()
	go l.failover(ctx)
	return nil
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
		if !managed(svc) {
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
			l.hold(ip, key(svc))
			n++
		}
	}
	close(l.loaded)
	log.Info("Loaded VIP assignments from Service status", "assignments", n)
	return nil
}

func managed(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil
}

func key(svc *v1.Service) string { return svc.Namespace + "/" + svc.Name }

func (l *loadBalancer) waitLoaded(ctx context.Context) error {
	select {
	case <-l.loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for VIP assignments to load: %w", ctx.Err())
	}
}

func (l *loadBalancer) hold(ip netip.Addr, svcKey string) *vipState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.vips[ip]
	if st == nil {
		st = &vipState{holders: map[string]bool{}}
		l.vips[ip] = st
	}
	st.holders[svcKey] = true
	return st
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
// host owns them, and has one eligible node answer for each.
func (l *loadBalancer) EnsureLoadBalancer(ctx context.Context, _ string, svc *v1.Service, nodes []*v1.Node) (*v1.LoadBalancerStatus, error) {
	if err := l.waitLoaded(ctx); err != nil {
		return nil, err
	}
	k := key(svc)
	req, err := lb.ParseRequest(svc)
	if err != nil {
		l.warnOnce(svc, ReasonInvalidRequest, err)
		return nil, err
	}
	had := l.alloc.Lookup(k)
	ips, err := l.alloc.Allocate(k, req)
	if err != nil {
		return nil, l.allocationFailed(svc, err)
	}
	l.mu.Lock()
	delete(l.pending, k)
	l.mu.Unlock()
	if !sameAddrs(had, ips) {
		l.recorder.Eventf(svc, v1.EventTypeNormal, ReasonAllocated, "Allocated %s", joinAddrs(ips))
		for _, old := range had {
			if !containsAddr(ips, old) {
				l.drop(ctx, old, k)
			}
		}
	}
	candidates := l.candidates(ctx, nodes)
	for _, ip := range ips {
		if err := l.announce(ctx, svc, ip, candidates); err != nil {
			return nil, err
		}
	}
	// Only success forgets the last warning: a retry that fails the same
	// way (taken, exhausted, conflict) must not repeat the event.
	l.clearWarning(k)
	return status(ips), nil
}

// UpdateLoadBalancer re-checks the answering nodes against the new node set.
func (l *loadBalancer) UpdateLoadBalancer(ctx context.Context, _ string, svc *v1.Service, nodes []*v1.Node) error {
	if err := l.waitLoaded(ctx); err != nil {
		return err
	}
	candidates := l.candidates(ctx, nodes)
	for _, ip := range l.alloc.Lookup(key(svc)) {
		if err := l.announce(ctx, svc, ip, candidates); err != nil {
			return err
		}
	}
	return nil
}

// EnsureLoadBalancerDeleted stops answering for the Service's VIPs (unless
// shared) and releases them; Services waiting for an address are nudged.
func (l *loadBalancer) EnsureLoadBalancerDeleted(ctx context.Context, _ string, svc *v1.Service) error {
	if err := l.waitLoaded(ctx); err != nil {
		return err
	}
	k := key(svc)
	ips := l.alloc.Lookup(k)
	for _, ip := range ips {
		l.drop(ctx, ip, k)
	}
	l.alloc.Release(k)
	l.mu.Lock()
	delete(l.pending, k)
	delete(l.warned, k)
	waiting := make([]string, 0, len(l.pending))
	for p := range l.pending {
		waiting = append(waiting, p)
	}
	l.mu.Unlock()
	if len(ips) > 0 {
		l.recorder.Eventf(svc, v1.EventTypeNormal, ReasonReleased, "Released %s", joinAddrs(ips))
		l.nudge(ctx, waiting)
	}
	return nil
}

// drop removes svcKey from ip's holders and stops answering when none is left.
func (l *loadBalancer) drop(ctx context.Context, ip netip.Addr, svcKey string) {
	l.mu.Lock()
	st := l.vips[ip]
	last := false
	if st != nil {
		delete(st.holders, svcKey)
		if len(st.holders) == 0 {
			delete(l.vips, ip)
			last = true
		}
	}
	l.mu.Unlock()
	if last {
		if err := l.ann.Remove(ip); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot stop announcing VIP", "ip", ip)
		}
	}
}

// nudge bumps RetryAnnotation on Services that wait for an address, so the
// service controller retries them now that one is free.
func (l *loadBalancer) nudge(ctx context.Context, keys []string) {
	stamp := time.Now().UTC().Format(time.RFC3339Nano)
	for _, k := range keys {
		ns, name := splitKey(k)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, RetryAnnotation, stamp)
		if _, err := l.client.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot nudge a Service waiting for a VIP", "service", k)
		}
	}
}

// allocationFailed turns an allocator error into one event and the error
// the service controller retries on.
func (l *loadBalancer) allocationFailed(svc *v1.Service, err error) error {
	k := key(svc)
	reason := ReasonInvalidRequest
	waits := false
	var (
		taken   *lb.IPTakenError
		notIn   *lb.NotInPoolError
		exhaust *lb.PoolExhaustedError
		ports   *lb.PortConflictError
	)
	switch {
	case errors.As(err, &exhaust):
		reason, waits = ReasonExhausted, true
	case errors.As(err, &taken), errors.As(err, &ports):
		reason, waits = ReasonTaken, true
	case errors.As(err, &notIn):
		reason = ReasonNotInPool
	}
	if waits {
		l.mu.Lock()
		l.pending[k] = true
		l.mu.Unlock()
	}
	l.warnOnce(svc, reason, err)
	return fmt.Errorf("service %s: %w", k, err)
}

// warnOnce emits a Warning event unless the same problem was reported for
// this Service already: retries must not flood the event stream.
func (l *loadBalancer) warnOnce(svc *v1.Service, reason string, err error) {
	k, msg := key(svc), err.Error()
	l.mu.Lock()
	seen := l.warned[k] == reason+msg
	l.warned[k] = reason + msg
	l.mu.Unlock()
	if !seen {
		l.recorder.Event(svc, v1.EventTypeWarning, reason, msg)
	}
}

func (l *loadBalancer) clearWarning(k string) {
	l.mu.Lock()
	delete(l.warned, k)
	l.mu.Unlock()
}

func sameAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func containsAddr(list []netip.Addr, ip netip.Addr) bool {
	for _, a := range list {
		if a == ip {
			return true
		}
	}
	return false
}

func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
