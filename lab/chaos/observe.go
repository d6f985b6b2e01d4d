package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
)

// The LAN client chaos probes VIPs from: a network namespace of its own
// (anonymous: it lives as long as chaos holds it) with a veth on the lab
// bridge, as a machine on the LAN would be (the CCM does not answer the
// host's own ARP requests).
const (
	chaosVethLab    = "lcchaos0" // in the lab namespace, a port of the bridge
	chaosVethClient = "lcchaos1" // in the client namespace
	chaosClientHost = 252        // its address: .252 of the lab's network
	excludeLBLabel  = "node.kubernetes.io/exclude-from-external-load-balancers"
)

// lanClient is the LAN client's namespace; Close removes it and its veth.
type lanClient struct {
	ns   netns.NsHandle
	addr netip.Prefix // on the lab's network
}

// chaosClientAddr is the LAN client's address on the lab's network a.
func chaosClientAddr(a lab.Addressing) netip.Prefix {
	return netip.PrefixFrom(a.Addr(chaosClientHost), a.Network().Bits())
}

// lanClientUp makes the LAN client with address addr. It runs in the
// lab's namespace.
func lanClientUp(addr netip.Prefix) (*lanClient, error) {
	if l, err := netlink.LinkByName(chaosVethLab); err == nil { // a crashed run's
		_ = netlink.LinkDel(l)
	}
	ns, err := newNetns()
	if err != nil {
		return nil, err
	}
	c := &lanClient{ns: ns, addr: addr}
	if err := c.plug(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newNetns makes a network namespace without entering it.
func newNetns() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	ns, err := netns.New() // enters it
	if err != nil {
		return 0, fmt.Errorf("new network namespace: %w", err)
	}
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("cannot restore the network namespace: %v", err)) // the thread would run in the wrong namespace
	}
	return ns, nil
}

// plug adds the veth pair, one end on the bridge, the other with the
// client's address in the client's namespace.
func (c *lanClient) plug() error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: chaosVethLab}, PeerName: chaosVethClient, PeerNamespace: netlink.NsFd(c.ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", chaosVethLab, err)
	}
	br, err := netlink.LinkByName(lab.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", lab.Bridge, err)
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		return fmt.Errorf("attach %s to %s: %w", chaosVethLab, lab.Bridge, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("link up %s: %w", chaosVethLab, err)
	}
	h, err := netlink.NewHandleAt(c.ns)
	if err != nil {
		return fmt.Errorf("netlink in the client namespace: %w", err)
	}
	defer h.Close()
	peer, err := h.LinkByName(chaosVethClient)
	if err != nil {
		return fmt.Errorf("%s: %w", chaosVethClient, err)
	}
	addr, err := netlink.ParseAddr(c.addr.String())
	if err != nil {
		return err
	}
	if err := h.AddrAdd(peer, addr); err != nil {
		return fmt.Errorf("address on %s: %w", chaosVethClient, err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		return fmt.Errorf("link up %s: %w", chaosVethClient, err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	return nil
}

// Close removes the veth pair and lets the namespace go.
func (c *lanClient) Close() {
	if l, err := netlink.LinkByName(chaosVethLab); err == nil {
		_ = netlink.LinkDel(l)
	}
	_ = c.ns.Close()
}

// arpProber sends ARP requests for VIPs from the LAN client and collects
// every answer.
type arpProber struct {
	c *arp.Client
}

// newARPProber opens a raw ARP socket on ifName in namespace ns. The
// socket stays in that namespace; the calling thread is restored.
func newARPProber(ns netns.NsHandle, ifName string) (*arpProber, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return nil, fmt.Errorf("enter the client network namespace: %w", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot restore the network namespace: %v", err)) // the thread would run in the wrong namespace
		}
	}()
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return nil, fmt.Errorf("%s in the client namespace: %w", ifName, err)
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("ARP socket on %s: %w", ifName, err)
	}
	return &arpProber{c: c}, nil
}

func (p *arpProber) Close() error { return p.c.Close() }

// Probe asks for every VIP and returns, for each, the distinct MACs that
// answered within wait; VIPs nobody answered are asked once more, as a
// client retries.
func (p *arpProber) Probe(ctx context.Context, vips []netip.Addr, wait time.Duration) (map[netip.Addr][]string, error) {
	out := map[netip.Addr][]string{}
	for attempt := 0; attempt < 2; attempt++ {
		var ask []netip.Addr
		for _, v := range vips {
			if len(out[v]) == 0 {
				ask = append(ask, v)
			}
		}
		if len(ask) == 0 || ctx.Err() != nil {
			break
		}
		for _, v := range ask {
			if err := p.c.Request(v); err != nil {
				return nil, fmt.Errorf("ARP request for %s: %w", v, err)
			}
		}
		if err := p.collect(ask, time.Now().Add(wait), out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// collect reads replies to our requests for vips until deadline.
func (p *arpProber) collect(vips []netip.Addr, deadline time.Time, out map[netip.Addr][]string) error {
	if err := p.c.SetReadDeadline(deadline); err != nil {
		return err
	}
	me := p.c.HardwareAddr().String()
	for {
		pkt, _, err := p.c.Read()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			if errors.Is(err, arp.ErrInvalidHardwareAddr) || errors.Is(err, arp.ErrInvalidIP) {
				continue // not an Ethernet/IPv4 ARP packet
			}
			return fmt.Errorf("read ARP: %w", err)
		}
		if pkt.Operation != arp.OperationReply || pkt.TargetHardwareAddr.String() != me || !slices.Contains(vips, pkt.SenderIP) {
			continue
		}
		mac := strings.ToLower(pkt.SenderHardwareAddr.String())
		if !slices.Contains(out[pkt.SenderIP], mac) {
			out[pkt.SenderIP] = append(out[pkt.SenderIP], mac)
			slices.Sort(out[pkt.SenderIP])
		}
	}
}

// observer takes snapshots of the lab.
type observer struct {
	st      *lab.State
	client  kubernetes.Interface
	arp     *arpProber
	subnets []netip.Prefix

	mu      sync.Mutex
	downAt  map[string]time.Time // when each domain was last made or seen to go down
	domains map[string]Domain
	lost    map[string]bool // hosts lost now: their libvirtd is frozen, not asked
	// ccmStarted is when chaos last started the CCM again (Snapshot.CCMStarted).
	ccmStarted time.Time
}

func newObserver(st *lab.State, client kubernetes.Interface, p *arpProber) *observer {
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
