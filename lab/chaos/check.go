package chaos

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/placement"
)

// This file is the decision half of `labcloud chaos`' invariant checks: a
// Snapshot of the lab (API objects, libvirt domains, ARP answers, owned
// routes) goes in, the Conditions that break an invariant come out.
// chaosobserve.go takes snapshots; chaossettle.go decides which conditions
// are violations, given the faults injected.

// Invariants `labcloud chaos` checks.
const (
	// InvVIPAnswered: each VIP in a Service status is answered by exactly
	// one MAC, that of a running, eligible node (with a ready endpoint, for
	// externalTrafficPolicy Local); unanswered only when no node is eligible.
	InvVIPAnswered = "vip-answered"
	// InvVIPUnique: no two Services hold one IP unless they are in one
	// namespace and carry the same sharing key.
	InvVIPUnique = "vip-unique"
	// InvNodeKept: no Node whose domain exists is deleted.
	InvNodeKept = "node-kept"
	// InvRoutes: the owned routes on the bridge are exactly the routes the
	// Nodes' pod CIDRs call for.
	InvRoutes = "routes"
	// InvNodeAddress: no Node has a VIP among its addresses.
	InvNodeAddress = "node-address"
)

// Snapshot is the lab at one moment, as the invariants see it.
type Snapshot struct {
	At      time.Time      // when taking it began
	End     time.Time      // when it was complete
	Subnets []netip.Prefix // the bridge's subnets, one per family
	Nodes   []Node
	// NodesAfter are the Nodes listed again once the ARP probe is done. A
	// node can become eligible (or stop being) while the probe runs, and
	// the CCM moves a VIP within milliseconds of the Node's update: a node
	// eligible in either listing may be the one answering.
	NodesAfter []Node
	// Domains are the lab's libvirt domains by name, as last seen;
	// DomainsKnown is false when libvirt could not be asked this time (then
	// every Node's domain is taken to exist).
	Domains      map[string]Domain
	DomainsKnown bool
	Services     []Service
	// ARP maps each probed VIP to the MACs that answered it, lower case.
	ARP map[netip.Addr][]string
	// Routes are the owned routes on the bridge.
	Routes []netroutes.Route
	// CCMStarted is when chaos last started the CCM again; zero if it has
	// run since before chaos began. A CCM cannot see a domain go down
	// before it starts: until the Node reports again it trusts the Node's
	// last Ready, as if the guest had run all along.
	CCMStarted time.Time
}

// Node is one Node.
type Node struct {
	Name     string
	UID      string
	Excluded bool // node.kubernetes.io/exclude-from-external-load-balancers
	// Reported is the Ready condition's last heartbeat; NotReady, that the
	// report said the node is not Ready; Unknown, that Ready is Unknown
	// (kube-controller-manager stopped hearing from the kubelet), since
	// UnknownSince (the condition's last transition).
	Reported     time.Time
	NotReady     bool
	Unknown      bool
	UnknownSince time.Time
	PodCIDRs     []netip.Prefix
	InternalIPs  []netip.Addr
	Addresses    []netip.Addr // all addresses, any type
}

// Domain is one libvirt domain.
type Domain struct {
	Running bool
	MAC     string // the NIC on the lab network, lower case
	// LastDown is when the domain was last seen or made to go down; zero
	// if never. Its Node is eligible only once it has reported since.
	LastDown time.Time
}

// Service is one LoadBalancer Service.
type Service struct {
	Key        string // namespace/name
	SharingKey string
	VIPs       []netip.Addr
	// Local: externalTrafficPolicy Local; only nodes among EndpointNodes
	// (those with a ready endpoint) may answer for its VIPs.
	Local         bool
	EndpointNodes []string
}

func (s Service) namespace() string { ns, _, _ := strings.Cut(s.Key, "/"); return ns }

// Condition is one broken invariant in one snapshot.
type Condition struct {
	Invariant string
	Subject   string // what it is about: a VIP, a Node, a route
	Detail    string
}

// ID identifies a condition across snapshots (the detail may change).
func (c Condition) ID() string { return c.Invariant + " " + c.Subject }

func (c Condition) String() string { return fmt.Sprintf("%s %s: %s", c.Invariant, c.Subject, c.Detail) }

// Immediate conditions are violations whatever faults were injected: no
// settle time excuses them.
func (c Condition) Immediate() bool { return c.Invariant == InvNodeKept }

// Evaluate returns the conditions that break an invariant in cur, sorted;
// prev (nil at the start) is the previous complete snapshot, for changes
// such as deleted Nodes.
func Evaluate(prev, cur *Snapshot) []Condition {
	var out []Condition
	out = append(out, checkVIPAnswers(cur)...)
	out = append(out, checkVIPUnique(cur)...)
	out = append(out, checkNodesKept(prev, cur)...)
	out = append(out, checkRoutes(cur)...)
	out = append(out, checkNodeAddresses(cur)...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

// eligibleMACs maps the MAC of each node that may answer for a VIP to the
// node: its domain runs, it is not excluded from load balancers, and it has
// reported Ready since its domain last went down (before that its status is the
// one from before; the guest is still booting), in either Node listing.
func eligibleMACs(s *Snapshot) map[string]string {
	return macsOfNodes(s, func(Node) bool { return false })
}

// keepingMACs are eligibleMACs plus the nodes whose Ready is Unknown that
// may keep the VIPs they answer (the CCM does not move VIPs for a
// control-plane outage): every such node when no node is eligible
// (noneEligible), else those that went Unknown less than
// placement.UnknownHold before the snapshot.
func keepingMACs(s *Snapshot, noneEligible bool) map[string]string {
	return macsOfNodes(s, func(n Node) bool {
		return n.Unknown && (noneEligible || s.At.Before(n.UnknownSince.Add(placement.UnknownHold)))
	})
}

// macsOfNodes maps the MACs of the nodes that may answer to the nodes; a
// node not Ready may if keeps says so.
func macsOfNodes(s *Snapshot, keeps func(Node) bool) map[string]string {
	out := map[string]string{}
	for _, n := range slices.Concat(s.Nodes, s.NodesAfter) {
		d, ok := s.Domains[n.Name]
		notReady := n.NotReady && !keeps(n)
		unseenReboot := d.LastDown.Before(s.CCMStarted)
		if !ok || !d.Running || n.Excluded || notReady || d.MAC == "" || (n.Reported.Before(d.LastDown.Truncate(time.Second)) && !unseenReboot) {
			continue
		}
		out[d.MAC] = n.Name
	}
	return out
}

// whoseMAC describes the owner of mac for a message.
func whoseMAC(s *Snapshot, mac string) string {
	for name, d := range s.Domains {
		if d.MAC == mac {
			state := "shut off"
			if d.Running {
				state = "running"
			}
			return fmt.Sprintf("%s of %s (domain %s, not eligible)", mac, name, state)
		}
	}
	return mac + " (no lab domain's)"
}

func checkVIPAnswers(s *Snapshot) []Condition {
	var out []Condition
	nodes := eligibleMACs(s)
	for _, vip := range snapshotVIPs(s) {
		macs := s.ARP[vip]
		eligible := narrowByEndpoints(nodes, s.Services, vip)
		c := Condition{Invariant: InvVIPAnswered, Subject: vip.String()}
		switch {
		case len(macs) == 0 && len(s.Domains) > 0 && len(eligible) == 0:
			continue // nobody may answer (externalTrafficPolicy Local without endpoints, or no node up)
		case len(macs) == 0:
			c.Detail = "no ARP answer"
		case len(macs) > 1:
			c.Detail = fmt.Sprintf("answered by %d MACs: %s", len(macs), strings.Join(macs, ", "))
		case len(s.Domains) == 0:
			continue // libvirt has not answered yet: nothing to judge the MAC by
		case narrowByEndpoints(keepingMACs(s, len(eligible) == 0), s.Services, vip)[macs[0]] != "":
			continue // eligible, or kept by an Unknown node
		case eligible[macs[0]] == "":
			if len(eligible) == 0 {
				c.Detail = fmt.Sprintf("answered by %s, and no node is eligible", whoseMAC(s, macs[0]))
			} else {
				c.Detail = "answered by " + whoseMAC(s, macs[0])
			}
		default:
			continue
		}
		out = append(out, c)
	}
	return out
}

// narrowByEndpoints keeps, of the eligible nodes (MAC -> node), those with
// a ready endpoint of every externalTrafficPolicy Local Service holding vip.
func narrowByEndpoints(eligible map[string]string, svcs []Service, vip netip.Addr) map[string]string {
	out := eligible
	for _, svc := range svcs {
		if !svc.Local || !slices.Contains(svc.VIPs, vip) {
			continue
		}
		narrowed := map[string]string{}
		for mac, node := range out {
			if slices.Contains(svc.EndpointNodes, node) {
				narrowed[mac] = node
			}
		}
		out = narrowed
	}
	return out
}

// snapshotVIPs are the distinct VIPs in the Services' status, sorted.
func snapshotVIPs(s *Snapshot) []netip.Addr {
	var out []netip.Addr
	for _, svc := range s.Services {
		for _, ip := range svc.VIPs {
			if !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func checkVIPUnique(s *Snapshot) []Condition {
	holders := map[netip.Addr][]Service{}
	for _, svc := range s.Services {
		for _, ip := range svc.VIPs {
			holders[ip] = append(holders[ip], svc)
		}
	}
	var out []Condition
	for _, ip := range snapshotVIPs(s) {
		hs := holders[ip]
		if len(hs) < 2 {
			continue
		}
		first, shared := hs[0], true
		for _, h := range hs[1:] {
			if first.SharingKey == "" || h.SharingKey != first.SharingKey || h.namespace() != first.namespace() {
				shared = false
			}
		}
		if shared {
			continue
		}
		var who []string
		for _, h := range hs {
			who = append(who, fmt.Sprintf("%s (sharing key %q)", h.Key, h.SharingKey))
		}
		out = append(out, Condition{Invariant: InvVIPUnique, Subject: ip.String(), Detail: "held by " + strings.Join(who, ", ")})
	}
	return out
}

func checkNodesKept(prev, cur *Snapshot) []Condition {
	if prev == nil {
		return nil
	}
	now := map[string]string{}
	for _, n := range cur.Nodes {
		now[n.Name] = n.UID
	}
	var out []Condition
	for _, n := range prev.Nodes {
		uid, ok := now[n.Name]
		if ok && uid == n.UID {
			continue
		}
		if _, exists := cur.Domains[n.Name]; cur.DomainsKnown && !exists {
			continue // its domain is gone: deleting the Node is right
		}
		what := "deleted"
		if ok {
			what = fmt.Sprintf("deleted and registered again (uid %s -> %s)", n.UID, uid)
		}
		out = append(out, Condition{Invariant: InvNodeKept, Subject: n.Name, Detail: "Node " + what + " while its domain exists"})
	}
	return out
}

func checkRoutes(s *Snapshot) []Condition {
	var nodes []netroutes.Node
	for _, n := range s.Nodes {
		nodes = append(nodes, netroutes.Node{Name: n.Name, PodCIDRs: n.PodCIDRs, Addresses: n.InternalIPs})
	}
	want, _ := netroutes.Desired(s.Subnets, nodes) // a pod CIDR with a problem gets no route
	missing, stale := netroutes.Diff(want, s.Routes)
	var out []Condition
	for _, r := range missing {
		detail := "missing"
		for _, a := range s.Routes {
			if a.Dst == r.Dst {
				detail = "via " + a.Gateway.String() + ", want via " + r.Gateway.String()
			}
		}
		out = append(out, Condition{Invariant: InvRoutes, Subject: r.Dst.String(), Detail: detail})
	}
	for _, r := range stale {
		if slices.ContainsFunc(want, func(w netroutes.Route) bool { return w.Dst == r.Dst }) {
			continue // reported as a wrong gateway above
		}
		out = append(out, Condition{Invariant: InvRoutes, Subject: r.Dst.String(), Detail: "owned route via " + r.Gateway.String() + " that no Node's pod CIDR calls for"})
	}
	return out
}

func checkNodeAddresses(s *Snapshot) []Condition {
	vips := snapshotVIPs(s)
	var out []Condition
	for _, n := range s.Nodes {
		for _, a := range n.Addresses {
			if slices.Contains(vips, a) {
				out = append(out, Condition{Invariant: InvNodeAddress, Subject: n.Name, Detail: fmt.Sprintf("has the VIP %s as an address", a)})
			}
		}
	}
	return out
}
