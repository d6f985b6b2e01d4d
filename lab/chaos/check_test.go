package chaos

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/placement"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

const (
	mac1 = "52:54:00:7c:00:01"
	mac2 = "52:54:00:7c:00:02"
)

func ip(s string) netip.Addr       { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// healthyLab is a two-node lab with one Service whose VIP node 1 answers
// and both pod-CIDR routes in place: no condition.
func healthyLab() *Snapshot {
	return &Snapshot{
		At: t0, End: t0.Add(time.Second), Subnets: []netip.Prefix{prefix("10.123.0.0/24")},
		Nodes: []Node{
			{Name: "n1", UID: "u1", Reported: t0, PodCIDRs: []netip.Prefix{prefix("10.244.0.0/24")}, InternalIPs: []netip.Addr{ip("10.123.0.101")}, Addresses: []netip.Addr{ip("10.123.0.101")}},
			{Name: "n2", UID: "u2", Reported: t0, PodCIDRs: []netip.Prefix{prefix("10.244.1.0/24")}, InternalIPs: []netip.Addr{ip("10.123.0.102")}, Addresses: []netip.Addr{ip("10.123.0.102")}},
		},
		Domains:      map[string]Domain{"n1": {Running: true, MAC: mac1}, "n2": {Running: true, MAC: mac2}},
		DomainsKnown: true,
		Services:     []Service{{Key: "default/web", VIPs: []netip.Addr{ip("10.123.0.200")}}},
		ARP:          map[netip.Addr][]string{ip("10.123.0.200"): {mac1}},
		Routes: []netroutes.Route{
			{Dst: prefix("10.244.0.0/24"), Gateway: ip("10.123.0.101")},
			{Dst: prefix("10.244.1.0/24"), Gateway: ip("10.123.0.102")},
		},
	}
}

func TestEvaluate(t *testing.T) {
	tests := []struct {
		name   string
		prev   func(*Snapshot) // nil: no previous snapshot
		change func(*Snapshot)
		want   []string // "invariant subject: detail substring"
	}{
		{name: "healthy lab", change: func(*Snapshot) {}},
		{name: "VIP unanswered", change: func(s *Snapshot) { s.ARP = nil },
			want: []string{"vip-answered 10.123.0.200: no ARP answer"}},
		{name: "VIP answered by two MACs", change: func(s *Snapshot) { s.ARP[ip("10.123.0.200")] = []string{mac1, mac2} },
			want: []string{"vip-answered 10.123.0.200: answered by 2 MACs"}},
		{name: "VIP answered by a stopped node", change: func(s *Snapshot) { s.Domains["n1"] = Domain{MAC: mac1} },
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain shut off"}},
		{name: "VIP answered by a node that has not reported since its domain came back",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(2 * time.Second)}
			},
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "a node that reported while the ARP probe ran",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(2 * time.Second)}
				s.NodesAfter = slices.Clone(s.Nodes)
				s.NodesAfter[0].Reported = t0.Add(3 * time.Second)
			}},
		{name: "a node not eligible before the probe nor after it",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(2 * time.Second)}
				s.NodesAfter = slices.Clone(s.Nodes)
			},
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "a CCM started after the domain came back cannot tell it rebooted",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(2 * time.Second)}
				s.CCMStarted = t0.Add(3 * time.Second)
			}},
		{name: "a CCM started before the domain went down saw it go",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(2 * time.Second)}
				s.CCMStarted = t0.Add(time.Second)
			},
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "a CCM started after the domain came back moves the VIP once the node is Unknown past its hold",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(-time.Minute)}
				s.CCMStarted = t0.Add(-50 * time.Second)
				s.Nodes[0].Reported = t0.Add(-70 * time.Second)
				s.Nodes[0].NotReady, s.Nodes[0].Unknown, s.Nodes[0].UnknownSince = true, true, t0.Add(-placement.UnknownHold)
			},
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "a report in the second the domain went down counts",
			change: func(s *Snapshot) {
				s.Domains["n1"] = Domain{Running: true, MAC: mac1, LastDown: t0.Add(300 * time.Millisecond)}
			}},
		{name: "VIP answered by an excluded node", change: func(s *Snapshot) { s.Nodes[0].Excluded = true },
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1"}},
		{name: "VIP answered by a stranger", change: func(s *Snapshot) { s.ARP[ip("10.123.0.200")] = []string{"02:00:00:00:00:09"} },
			want: []string{"vip-answered 10.123.0.200: answered by 02:00:00:00:00:09 (no lab domain's)"}},
		{name: "no node eligible", change: func(s *Snapshot) {
			s.Domains["n1"] = Domain{MAC: mac1}
			s.Domains["n2"] = Domain{MAC: mac2}
		}, want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain shut off, not eligible), and no node is eligible"}},
		{name: "every node Unknown: the answering one may keep it", change: func(s *Snapshot) {
			s.Nodes[0].NotReady, s.Nodes[0].Unknown = true, true
			s.Nodes[1].NotReady, s.Nodes[1].Unknown = true, true
		}},
		{name: "an Unknown node keeps a VIP another node is eligible for, past its hold", change: func(s *Snapshot) {
			s.Nodes[0].NotReady, s.Nodes[0].Unknown, s.Nodes[0].UnknownSince = true, true, t0.Add(-placement.UnknownHold)
		}, want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "an Unknown node keeps a VIP another node is eligible for, within its hold", change: func(s *Snapshot) {
			s.Nodes[0].NotReady, s.Nodes[0].Unknown, s.Nodes[0].UnknownSince = true, true, t0.Add(time.Second-placement.UnknownHold)
		}},
		{name: "a node reported NotReady keeps a VIP", change: func(s *Snapshot) {
			s.Nodes[0].NotReady = true
			s.Nodes[1].NotReady, s.Nodes[1].Unknown = true, true
		}, want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible), and no node is eligible"}},
		{name: "no node up: unanswered is right", change: func(s *Snapshot) {
			s.Domains["n1"] = Domain{MAC: mac1}
			s.Domains["n2"] = Domain{MAC: mac2}
			s.ARP = nil
		}},
		{name: "Local policy: answered by a node without endpoints", change: func(s *Snapshot) {
			s.Services[0].Local, s.Services[0].EndpointNodes = true, []string{"n2"}
		}, want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "Local policy: answered by the node with endpoints", change: func(s *Snapshot) {
			s.Services[0].Local, s.Services[0].EndpointNodes = true, []string{"n2"}
			s.ARP[ip("10.123.0.200")] = []string{mac2}
		}},
		{name: "Local policy without endpoints: unanswered is right", change: func(s *Snapshot) {
			s.Services[0].Local = true
			s.ARP = nil
		}},
		{name: "Local policy without endpoints: answered", change: func(s *Snapshot) { s.Services[0].Local = true },
			want: []string{"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible), and no node is eligible"}},
		{name: "libvirt down: the last known domains judge the answer", change: func(s *Snapshot) {
			s.DomainsKnown = false
			s.ARP[ip("10.123.0.200")] = []string{mac2}
		}},
		{name: "libvirt never answered: any one MAC counts", change: func(s *Snapshot) {
			s.DomainsKnown, s.Domains = false, nil
			s.ARP[ip("10.123.0.200")] = []string{"02:00:00:00:00:09"}
		}},
		{name: "two Services, one IP, no key", change: func(s *Snapshot) {
			s.Services = append(s.Services, Service{Key: "default/db", VIPs: []netip.Addr{ip("10.123.0.200")}})
		}, want: []string{`vip-unique 10.123.0.200: held by default/web (sharing key ""), default/db`}},
		{name: "two Services sharing a key", change: func(s *Snapshot) {
			s.Services = []Service{
				{Key: "default/a", SharingKey: "k", VIPs: []netip.Addr{ip("10.123.0.200")}},
				{Key: "default/b", SharingKey: "k", VIPs: []netip.Addr{ip("10.123.0.200")}},
			}
		}},
		{name: "two Services with different keys", change: func(s *Snapshot) {
			s.Services = []Service{
				{Key: "default/a", SharingKey: "k", VIPs: []netip.Addr{ip("10.123.0.200")}},
				{Key: "default/b", SharingKey: "j", VIPs: []netip.Addr{ip("10.123.0.200")}},
			}
		}, want: []string{"vip-unique 10.123.0.200: held by default/a"}},
		{name: "one key in two namespaces does not share", change: func(s *Snapshot) {
			s.Services = []Service{
				{Key: "default/a", SharingKey: "k", VIPs: []netip.Addr{ip("10.123.0.200")}},
				{Key: "other/b", SharingKey: "k", VIPs: []netip.Addr{ip("10.123.0.200")}},
			}
		}, want: []string{"vip-unique 10.123.0.200: held by default/a"}},
		{name: "Node of a running domain deleted", prev: func(*Snapshot) {}, change: func(s *Snapshot) { s.Nodes = s.Nodes[1:] },
			want: []string{"node-kept n1: Node deleted while its domain exists", "routes 10.244.0.0/24: owned route via 10.123.0.101 that no Node",
				"vip-answered 10.123.0.200: answered by 52:54:00:7c:00:01 of n1 (domain running, not eligible)"}},
		{name: "Node of a stopped domain deleted", prev: func(*Snapshot) {}, change: func(s *Snapshot) {
			s.Nodes = s.Nodes[1:]
			s.Domains["n1"] = Domain{MAC: mac1}
			s.Routes = s.Routes[1:]
			s.ARP[ip("10.123.0.200")] = []string{mac2}
		}, want: []string{"node-kept n1: Node deleted while its domain exists"}},
		{name: "Node deleted and registered again", prev: func(*Snapshot) {}, change: func(s *Snapshot) { s.Nodes[0].UID = "u9" },
			want: []string{"node-kept n1: Node deleted and registered again (uid u1 -> u9)"}},
		{name: "Node deleted while libvirt is down", prev: func(*Snapshot) {}, change: func(s *Snapshot) {
			s.Nodes, s.Routes = s.Nodes[1:], s.Routes[1:]
			s.DomainsKnown, s.Domains = false, nil
		}, want: []string{"node-kept n1"}},
		{name: "Node of an undefined domain deleted", prev: func(*Snapshot) {}, change: func(s *Snapshot) {
			s.Nodes, s.Routes = s.Nodes[1:], s.Routes[1:]
			delete(s.Domains, "n1")
			s.ARP[ip("10.123.0.200")] = []string{mac2}
		}},
		{name: "route missing", change: func(s *Snapshot) { s.Routes = s.Routes[1:] },
			want: []string{"routes 10.244.0.0/24: missing"}},
		{name: "route via the wrong gateway", change: func(s *Snapshot) { s.Routes[0].Gateway = ip("10.123.0.200") },
			want: []string{"routes 10.244.0.0/24: via 10.123.0.200, want via 10.123.0.101"}},
		{name: "stale route", change: func(s *Snapshot) {
			s.Routes = append(s.Routes, netroutes.Route{Dst: prefix("10.244.7.0/24"), Gateway: ip("10.123.0.107")})
		}, want: []string{"routes 10.244.7.0/24: owned route via 10.123.0.107 that no Node's pod CIDR calls for"}},
		{name: "Node without a pod CIDR has no route", change: func(s *Snapshot) {
			s.Nodes[1].PodCIDRs = nil
			s.Routes = s.Routes[:1]
		}},
		{name: "a VIP as a Node address", change: func(s *Snapshot) {
			s.Nodes[0].Addresses = append(s.Nodes[0].Addresses, ip("10.123.0.200"))
		}, want: []string{"node-address n1: has the VIP 10.123.0.200 as an address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prev *Snapshot
			if tt.prev != nil {
				prev = healthyLab()
				tt.prev(prev)
			}
			cur := healthyLab()
			tt.change(cur)
			got := Evaluate(prev, cur)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d conditions, want %d:\n%s", len(got), len(tt.want), conditions(got))
			}
			for i, w := range tt.want {
				subject, detail, _ := strings.Cut(w, ": ")
				if got[i].ID() != subject || !strings.Contains(got[i].Detail, detail) {
					t.Errorf("condition %d = %q, want %q", i, got[i], w)
				}
			}
		})
	}
}

func conditions(cs []Condition) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.String())
	}
	return strings.Join(s, "\n")
}

func TestEligibleMACs(t *testing.T) {
	s := healthyLab()
	s.Domains["n2"] = Domain{Running: true, MAC: mac2, LastDown: t0.Add(5 * time.Second)}
	got := eligibleMACs(s)
	if len(got) != 1 || got[mac1] != "n1" {
		t.Errorf("eligible = %v, want only n1", got)
	}
	// A rebooted kubelet's first report says NotReady: still not eligible
	// (no node may answer through a node that says it is not Ready).
	s.Nodes[1].Reported, s.Nodes[1].NotReady = t0.Add(6*time.Second), true
	if got := eligibleMACs(s); len(got) != 1 || got[mac1] != "n1" {
		t.Errorf("eligible after n2 reported NotReady = %v, want only n1", got)
	}
	s.Nodes[1].NotReady = false
	if got := eligibleMACs(s); len(got) != 2 {
		t.Errorf("eligible after n2 reported Ready = %v, want both", got)
	}
}

func TestSnapshotVIPsSortedAndDistinct(t *testing.T) {
	s := &Snapshot{Services: []Service{
		{VIPs: []netip.Addr{ip("10.123.0.210")}},
		{VIPs: []netip.Addr{ip("10.123.0.201"), ip("10.123.0.210")}},
	}}
	got := snapshotVIPs(s)
	if want := []netip.Addr{ip("10.123.0.201"), ip("10.123.0.210")}; !slices.Equal(got, want) {
		t.Errorf("snapshotVIPs = %v, want %v", got, want)
	}
}
