package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
)

// The LAN client chaos probes VIPs from (lanprobe): a machine on the lab's
// bridge, as the CCM answers none of the host's own ARP requests. Its
// namespace has no name: it lives as long as chaos holds it.
const (
	chaosPort       = "lcchaos0" // its port on the bridge
	chaosClientHost = 252        // its address: .252 of the lab's network
	excludeLBLabel  = "node.kubernetes.io/exclude-from-external-load-balancers"
)

// lanClient plugs the LAN client into the bridge, on the lab's network a.
// It runs in the lab's namespace.
func lanClient(a lab.Addressing) (*lanprobe.Client, error) {
	return lanprobe.New(lanprobe.Options{Bridge: lab.Bridge, Port: chaosPort, Addr: netip.PrefixFrom(a.Addr(chaosClientHost), a.Network().Bits())})
}

// observer takes snapshots of the lab.
type observer struct {
	st      *lab.State
	client  kubernetes.Interface
	arp     *lanprobe.Capture // the LAN client's
	subnets []netip.Prefix

	mu      sync.Mutex
	downAt  map[string]time.Time // when each domain was last made or seen to go down
	domains map[string]Domain
	lost    map[string]bool // hosts lost now: their libvirtd is frozen, not asked
	// ccmStarted is when chaos last started the CCM again (Snapshot.CCMStarted).
	ccmStarted time.Time
}

func newObserver(st *lab.State, client kubernetes.Interface, p *lanprobe.Capture) *observer {
	return &observer{st: st, client: client, arp: p, subnets: st.Addressing.Subnets(st.IPFamily), downAt: map[string]time.Time{}, lost: map[string]bool{}}
}

// wentDown records that chaos stopped a domain at t.
func (o *observer) wentDown(name string, t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t.After(o.downAt[name]) {
		o.downAt[name] = t
	}
}

// ccmStartedAt records that chaos started the CCM again at t.
func (o *observer) ccmStartedAt(t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ccmStarted = t
}

// snapshot reads the lab. An error means the snapshot is incomplete (the
// API server or the kernel could not be read) and must not be judged.
func (o *observer) snapshot(ctx context.Context) (*Snapshot, error) {
	o.mu.Lock()
	s := &Snapshot{At: time.Now(), Subnets: o.subnets, CCMStarted: o.ccmStarted}
	o.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var err error
	if s.Nodes, err = o.listNodes(cctx); err != nil {
		return nil, err
	}
	svcs, err := o.client.CoreV1().Services("").List(cctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	eps, err := o.client.DiscoveryV1().EndpointSlices("").List(cctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list endpoint slices: %w", err)
	}
	for i := range svcs.Items {
		if svc := &svcs.Items[i]; svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			s.Services = append(s.Services, snapService(svc, eps.Items))
		}
	}
	s.Domains, s.DomainsKnown = o.readDomains(s.At)
	if s.Routes, err = host.Routes(lab.Bridge, netroutes.DefaultProtocol); err != nil {
		return nil, err
	}
	if s.ARP, err = o.arp.Probe(ctx, snapshotVIPs(s), 400*time.Millisecond); err != nil {
		return nil, err
	}
	if s.NodesAfter, err = o.listNodes(cctx); err != nil {
		return nil, err
	}
	return s, nil
}

// listNodes lists the Nodes as a snapshot keeps them.
func (o *observer) listNodes(ctx context.Context) ([]Node, error) {
	nodes, err := o.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]Node, 0, len(nodes.Items))
	for i := range nodes.Items {
		out = append(out, snapNode(&nodes.Items[i]))
	}
	return out, nil
}

func snapNode(n *v1.Node) Node {
	sn := Node{Name: n.Name, UID: string(n.UID)}
	_, sn.Excluded = n.Labels[excludeLBLabel]
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			sn.Reported, sn.NotReady, sn.Unknown = c.LastHeartbeatTime.Time, c.Status != v1.ConditionTrue, c.Status == v1.ConditionUnknown
			if sn.Unknown {
				sn.UnknownSince = c.LastTransitionTime.Time
			}
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			sn.PodCIDRs = append(sn.PodCIDRs, p)
		}
	}
	for _, a := range n.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		sn.Addresses = append(sn.Addresses, ip)
		if a.Type == v1.NodeInternalIP {
			sn.InternalIPs = append(sn.InternalIPs, ip)
		}
	}
	return sn
}

func snapService(svc *v1.Service, eps []discoveryv1.EndpointSlice) Service {
	ss := Service{Key: svc.Namespace + "/" + svc.Name, SharingKey: svc.Annotations[lb.AnnotationSharingKey],
		Local: svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal}
	for _, es := range eps {
		if es.Namespace != svc.Namespace || es.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && !slices.Contains(ss.EndpointNodes, *ep.NodeName) {
				ss.EndpointNodes = append(ss.EndpointNodes, *ep.NodeName)
			}
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(ing.IP); err == nil {
			ss.VIPs = append(ss.VIPs, ip)
		}
	}
	return ss
}

// readDomains asks each host's libvirt for the lab's domains. A host that
// cannot be asked (lost) keeps its domains as last seen, shut off: they
// exist, so their Nodes must be kept, but they may answer for no VIP.
// When no host can be asked it returns the last domains it saw and false.
func (o *observer) readDomains(now time.Time) (map[string]Domain, bool) {
	got, asked := map[string]Domain{}, false
	qemus := host.QEMUs(lab.NodePrefix)
	for _, h := range o.st.LabHosts() {
		o.mu.Lock()
		lost := o.lost[h.Name]
		o.mu.Unlock()
		var doms map[string]host.Domain
		err := errHostLost
		if !lost {
			doms, err = host.Domains(h.URI, lab.NetworkName, lab.NodePrefix)
		}
		o.mu.Lock()
		if err != nil {
			for name, d := range o.domains {
				if on, _ := o.st.HostOfNode(name); on.Name == h.Name {
					d.Running = false
					got[name] = d
				}
			}
			o.mu.Unlock()
			continue
		}
		asked = true
		for name, dom := range doms {
			d := Domain{Running: dom.Running, MAC: dom.MAC}
			if !d.Running && now.After(o.downAt[name]) {
				o.downAt[name] = now
			}
			d.LastDown = o.downAt[name]
			// A guest that booted before chaos began was down just before
			// its QEMU started.
			if pid, err := host.OneQEMU(qemus, name); d.Running && err == nil {
				if started, err := host.Started(pid); err == nil && started.After(d.LastDown) {
					d.LastDown = started
				}
			}
			got[name] = d
		}
		o.mu.Unlock()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !asked {
		return o.domains, false
	}
	o.domains = got
	return got, true
}

var errHostLost = errors.New("host lost")

// hostBack records that a lost host runs again: its libvirtd is asked.
func (o *observer) hostBack(hostName string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.lost, hostName)
}

// hostLost records that host is lost, and every guest of it went down at t.
func (o *observer) hostLost(hostName string, t time.Time) {
	o.mu.Lock()
	o.lost[hostName] = true
	o.mu.Unlock()
	for _, n := range o.st.Nodes {
		if on, _ := o.st.HostOfNode(n); on.Name == hostName {
			o.wentDown(n, t)
		}
	}
}
