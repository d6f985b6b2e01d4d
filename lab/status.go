package lab

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider"
)

// Status is the lab at a glance: node ↔ domain ↔ addresses ↔ pod CIDR ↔
// route, and Service ↔ VIP ↔ answering node/MAC.
type Status struct {
	Kubeconfig string `json:"kubeconfig"`
	APIServer  string `json:"apiServer"`
	// HostKubeconfig works from the host (API server at HostAPIServer).
	HostKubeconfig string          `json:"hostKubeconfig,omitempty"`
	HostAPIServer  string          `json:"hostAPIServer,omitempty"`
	At             time.Time       `json:"at"` // when it was read
	Nodes          []NodeStatus    `json:"nodes"`
	Services       []ServiceStatus `json:"services"`
	// Router is the LAN router's side, when the lab has one.
	Router *RouterStatus `json:"router,omitempty"`
	// Pools are the VIP pools of the cloud config the CCM runs with: what
	// a CI job may expect its LoadBalancer addresses from.
	Pools []lb.PoolConfig `json:"pools,omitempty"`
}

// RouterStatus is the LAN router's BGP session with the CCM.
type RouterStatus struct {
	Address string `json:"address"`
	// Session is its BGP state with the CCM (e.g. Established, Active);
	// with several hosts, with the first host's replica.
	Session string `json:"session"`
	// Sessions are its BGP states with each host's replica, by host name,
	// in a lab of several hosts.
	Sessions map[string]string `json:"sessions,omitempty"`
}

// NodeStatus is one lab node.
type NodeStatus struct {
	Name        string   `json:"name"`
	Host        string   `json:"host"` // the hypervisor host: the CCM's label libvirt.labcloud.io/host
	Domain      string   `json:"domain"`
	DomainState string   `json:"domainState"`
	MAC         string   `json:"mac"`
	ProviderID  string   `json:"providerID"`
	Ready       string   `json:"ready"`
	Addresses   []string `json:"addresses"`
	PodCIDR     string   `json:"podCIDR"`
	// PodCIDRs are one per family, PodCIDR (the primary) first.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// Route is the CCM's route of each pod CIDR that has one, in order.
	Route string `json:"route"`
	// RouterRoute is the LAN router's BGP route of each pod CIDR that
	// has one, in order.
	RouterRoute string   `json:"routerRoute,omitempty"`
	Taints      []string `json:"taints,omitempty"`
}

// ServiceStatus is one VIP of a LoadBalancer Service: who answers for it
// and since when, as the CCM's lb.labcloud.io/Announced condition says,
// the MAC the host's neighbour table has for it (what the wire says), and
// the nodes the host's spread route to it goes via.
type ServiceStatus struct {
	Service string `json:"service"`
	VIP     string `json:"vip"`
	Node    string `json:"node"`
	MAC     string `json:"mac"`
	// Since is the condition's lastTransitionTime: when the current answer
	// (or the lack of one) began.
	Since *time.Time `json:"since,omitempty"`
	// Placement is the condition's reason (Announced, NoEligibleNode), or
	// why there is none to read.
	Placement     string   `json:"placement"`
	HostNeighbour string   `json:"hostNeighbour"`
	RoutedVia     []string `json:"routedVia,omitempty"`
}

// hostSide is what the host's kernel says of the VIPs: the MAC of each
// one's permanent neighbour entry, and the nodes its spread route (proto
// 77) goes via.
type hostSide struct {
	neighbour map[string]string
	routedVia map[string][]string
}

// GetStatus reads the lab's state from the API server, libvirt and the
// kernel. It runs inside the lab's namespace.
func GetStatus(ctx context.Context, st *State) (*Status, error) {
	client, err := AdminClient(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	out := &Status{Kubeconfig: st.Kubeconfig, APIServer: st.APIServer, HostKubeconfig: st.HostKubeconfig, HostAPIServer: st.HostAPIServer, At: time.Now()}
	if !st.Light {
		cfg, err := provider.LoadConfigFile(ccmCloudConfig(st.Dir))
		if err != nil {
			return nil, err
		}
		out.Pools = cfg.LoadBalancer.Pools
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	routes, _ := host.PodCIDRRoutes("", Bridge)
	domains := map[string]host.Domain{}
	for _, h := range st.LabHosts() {
		if !h.Lost { // a lost host's libvirtd is frozen: it would never answer
			on, _ := host.Domains(h.URI, NetworkName, NodePrefix)
			maps.Copy(domains, on)
		}
	}
	var rib map[netip.Prefix]frr.Route
	if st.Router {
		r := frr.Open(routerDir(st.Dir))
		out.Router = &RouterStatus{Address: st.routerAddress(), Session: "unknown"}
		hosts := st.LabHosts()
		for _, h := range hosts {
			s, err := r.NeighborState(ctx, netip.MustParseAddr(h.lanAddress()))
			if err != nil {
				s = "unknown"
			}
			if h.Index == 1 {
				out.Router.Session = s
			}
			if len(hosts) > 1 {
				if out.Router.Sessions == nil {
					out.Router.Sessions = map[string]string{}
				}
				out.Router.Sessions[h.Name] = s
			}
		}
		families := []string{"ip"}
		if st.IPFamily.HasIPv6() {
			families = append(families, "ipv6")
		}
		rib = map[netip.Prefix]frr.Route{}
		for _, family := range families {
			routes, _ := r.BGPRoutes(ctx, family)
			maps.Copy(rib, routes)
		}
	}
	for _, n := range nodes.Items {
		ns := nodeRow(&n)
		if d, ok := domains[n.Name]; ok {
			ns.Domain, ns.DomainState, ns.MAC = n.Name, d.State, d.MAC
		}
		ns.PodCIDRs = PodCIDRs(&n)
		var rs []string
		for _, c := range ns.PodCIDRs {
			if gw, ok := routes[c]; ok {
				r := fmt.Sprintf("via %s dev %s proto %d", gw, Bridge, netroutes.DefaultProtocol)
				if len(ns.PodCIDRs) > 1 {
					r = c + " " + r
				}
				rs = append(rs, r)
			}
		}
		ns.Route = strings.Join(rs, "; ")
		ns.RouterRoute = routerRoutes(rib, ns.PodCIDRs)
		out.Nodes = append(out.Nodes, ns)
	}
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	side := hostSide{neighbour: host.PermanentNeighbours(Bridge), routedVia: vipRoutes(nodes.Items)}
	for i := range svcs.Items {
		out.Services = append(out.Services, serviceRows(&svcs.Items[i], side)...)
	}
	sort.Slice(out.Nodes, func(i, j int) bool { return out.Nodes[i].Name < out.Nodes[j].Name })
	sort.SliceStable(out.Services, func(i, j int) bool { return out.Services[i].Service < out.Services[j].Service })
	return out, nil
}

// nodeRow is what the Node itself says of its row.
func nodeRow(n *v1.Node) NodeStatus {
	ns := NodeStatus{Name: n.Name, Host: n.Labels[provider.LabelHost], ProviderID: n.Spec.ProviderID, PodCIDR: n.Spec.PodCIDR, Ready: "Unknown"}
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			ns.Ready = string(c.Status)
		}
	}
	for _, a := range n.Status.Addresses {
		ns.Addresses = append(ns.Addresses, fmt.Sprintf("%s=%s", a.Type, a.Address))
	}
	for _, t := range n.Spec.Taints {
		ns.Taints = append(ns.Taints, t.Key)
	}
	return ns
}

// serviceRows are a LoadBalancer Service's VIPs (one row without a VIP
// while it has none), read from its Announced condition, beside what the
// host's kernel has for them.
func serviceRows(s *v1.Service, side hostSide) []ServiceStatus {
	if s.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil
	}
	name := s.Namespace + "/" + s.Name
	placement, answers := "no "+lb.ConditionAnnounced+" condition yet", map[string]lb.Answer{}
	var since *time.Time
	if c := meta.FindStatusCondition(s.Status.Conditions, lb.ConditionAnnounced); c != nil {
		t := c.LastTransitionTime.Time
		placement, since = c.Reason, &t
		parsed, err := lb.ParseAnnounced(*c)
		if err != nil {
			placement = err.Error()
		}
		for _, a := range parsed {
			answers[a.VIP.String()] = a
		}
	}
	var rows []ServiceStatus
	for _, ing := range s.Status.LoadBalancer.Ingress {
		row := ServiceStatus{Service: name, VIP: ing.IP, Since: since, Placement: placement,
			HostNeighbour: side.neighbour[ing.IP], RoutedVia: side.routedVia[ing.IP]}
		if a, ok := answers[ing.IP]; ok {
			row.Node = a.Node
			if a.MAC != nil {
				row.MAC = a.MAC.String()
			}
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		rows = append(rows, ServiceStatus{Service: name, Placement: "no VIP yet"})
	}
	return rows
}

// WriteTable prints the status as two tables.
func (s *Status) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tHOST\tDOMAIN\tSTATE\tREADY\tADDRESSES\tPOD CIDR\tROUTE\tROUTER (BGP)\tPROVIDER ID")
	for _, n := range s.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, dash(n.Host), dash(n.Domain), dash(n.DomainState), n.Ready,
			dash(strings.Join(n.Addresses, ",")), dash(strings.Join(n.PodCIDRs, ",")), dash(n.Route), dash(n.RouterRoute), dash(n.ProviderID))
	}
	if s.Router != nil {
		if len(s.Router.Sessions) > 0 {
			var each []string
			for _, h := range slices.Sorted(maps.Keys(s.Router.Sessions)) {
				each = append(each, h+" "+s.Router.Sessions[h])
			}
			fmt.Fprintf(tw, "\nROUTER %s: BGP sessions with the CCM replicas: %s\n", s.Router.Address, strings.Join(each, ", "))
		} else {
			fmt.Fprintf(tw, "\nROUTER %s: BGP session with the CCM %s\n", s.Router.Address, s.Router.Session)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "SERVICE\tVIP\tANSWERED BY\tMAC\tSINCE\tPLACEMENT\tHOST NEIGHBOUR\tROUTED VIA")
	for _, v := range s.Services {
		since := "-"
		if v.Since != nil {
			since = duration.HumanDuration(s.At.Sub(*v.Since)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Service, dash(v.VIP), dash(v.Node), dash(v.MAC), since, v.Placement,
			dash(v.HostNeighbour), dash(strings.Join(v.RoutedVia, ",")))
	}
	tw.Flush()
}

// routerRoutes says how the router reaches each pod CIDR it has a route to.
func routerRoutes(rib map[netip.Prefix]frr.Route, cidrs []string) string {
	var rs []string
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		if r, ok := rib[p]; ok && len(r.NextHops) > 0 {
			hops := make([]string, len(r.NextHops))
			for i, h := range r.NextHops {
				hops[i] = h.String()
			}
			s := "via " + strings.Join(hops, ",")
			if len(cidrs) > 1 {
				s = c + " " + s
			}
			rs = append(rs, s)
		}
	}
	return strings.Join(rs, "; ")
}

// PodCIDRs are a Node's pod CIDRs, one per family.
func PodCIDRs(n *v1.Node) []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// vipRoutes are the CCM's spread routes on the bridge: VIP → the nodes
// (named by their InternalIPs) the route goes via, sorted.
func vipRoutes(nodes []v1.Node) map[string][]string {
	out := map[string][]string{}
	byIP := map[netip.Addr]string{}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == v1.NodeInternalIP {
				byIP[ip] = n.Name
			}
		}
	}
	paths, err := host.SpreadRoutes(Bridge)
	if err != nil {
		return out
	}
	for _, p := range paths {
		var via []string
		for _, gw := range p.Gateways {
			if name, ok := byIP[gw]; ok {
				via = append(via, name)
			} else {
				via = append(via, gw.String())
			}
		}
		slices.Sort(via)
		out[p.Dst.Addr().String()] = via
	}
	return out
}
