package lab

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/provider"
)

// One host is the lab as it always was; several are apart in every name
// and address, and each but the first has a libvirtd of its own.
func TestLabHosts(t *testing.T) {
	one := labHosts("/var/lib/labcloud/lab", 1, Addressing{})
	if len(one) != 1 || !reflect.DeepEqual(one[0], Host{Index: 1, Name: labHost, Netns: Netns, Address: Gateway, Address6: Gateway6, URI: labURI}) {
		t.Fatalf("one host: %+v", one)
	}
	hosts := labHosts("/var/lib/labcloud/lab", 3, Addressing{})
	seen := map[string]bool{}
	for i, h := range hosts {
		if h.Index != i+1 {
			t.Errorf("host %d has index %d", i+1, h.Index)
		}
		for _, v := range []string{h.Name, h.Netns, h.Address, h.Address6, h.URI} {
			if seen[v] && v != Netns && v != labURI {
				t.Errorf("host %s repeats %q", h.Name, v)
			}
			seen[v] = true
		}
	}
	if hosts[0].Netns != Netns || hosts[0].URI != labURI || hosts[0].Address != Gateway {
		t.Errorf("the first host must be the lab's namespace and libvirtd: %+v", hosts[0])
	}
	for _, h := range hosts[1:] {
		if h.Netns == Netns || !strings.HasPrefix(h.URI, "qemu+unix:///system?socket=/run/labcloud/") || len(h.URI) > 100 {
			t.Errorf("host %s: namespace %s, URI %s; want its own namespace and a short socket path", h.Name, h.Netns, h.URI)
		}
	}
	if other := labHosts("/tmp/other", 3, Addressing{}); other[1].URI == hosts[1].URI {
		t.Errorf("two state directories share %s", other[1].URI)
	}
}

// Guests go round robin; each host's network leases to its own guests
// only, with the router as their gateway.
func TestHostNetworks(t *testing.T) {
	var got []int
	for i := 1; i <= 5; i++ {
		got = append(got, hostOfGuest(i, 2))
	}
	if !slices.Equal(got, []int{1, 2, 1, 2, 1}) {
		t.Errorf("guests 1-5 on hosts %v, want round robin", got)
	}
	hosts := labHosts("/var/lib/labcloud/lab", 2, Addressing{})
	leased := map[string]int{}
	for _, h := range hosts {
		x, err := hostNetwork(h, len(hosts), defaults.Of(DualStack)).XML()
		if err != nil {
			t.Fatal(err)
		}
		var n libvirtxml.Network
		if err := n.Unmarshal(x); err != nil {
			t.Fatalf("%v\n%s", err, x)
		}
		ip := n.IPs[0]
		if ip.Address != h.Address || ip.DHCP == nil || len(ip.DHCP.Ranges) != 0 {
			t.Fatalf("%s: want its own address and no DHCP range:\n%s", h.Name, x)
		}
		for _, s := range ip.DHCP.Hosts {
			leased[s.MAC]++
			for g := 1; g <= MaxNodes; g++ {
				if nodeMAC(g) == s.MAC && (hostOfGuest(g, 2) != h.Index || guestIPv4(defaults.octets(), g) != s.IP) {
					t.Errorf("%s leases %s to guest %d of host %d", h.Name, s.IP, g, hostOfGuest(g, 2))
				}
			}
		}
		if n.DnsmasqOptions == nil || len(n.DnsmasqOptions.Option) != 3 || n.DnsmasqOptions.Option[0].Value != "dhcp-option=option:router,"+RouterAddr ||
			n.DnsmasqOptions.Option[1].Value != "dhcp-option=option:dns-server,"+Gateway || n.DnsmasqOptions.Option[2].Value != "ra-param="+Bridge+",10,0" {
			t.Errorf("%s: want the router %s as the guests' gateway, the cluster DNS %s as their resolver, and advertisements that say the host is no router:\n%s", h.Name, RouterAddr, Gateway, x)
		}
		if len(n.IPs) != 2 || n.IPs[1].Address != h.Address6 || n.IPs[1].DHCP == nil || len(n.IPs[1].DHCP.Ranges) != 0 || len(n.IPs[1].DHCP.Hosts) != len(ip.DHCP.Hosts) {
			t.Errorf("%s: want its IPv6 address %s and DHCPv6 for its own guests only:\n%s", h.Name, h.Address6, x)
		}
	}
	if len(leased) != MaxNodes {
		t.Errorf("%d guests have a lease, want %d", len(leased), MaxNodes)
	}
	for mac, n := range leased {
		if n != 1 {
			t.Errorf("%s leased by %d hosts", mac, n)
		}
	}
}

// The router peers with every host's replica, each on its bridge's address.
func TestRouterPeersWithEveryHost(t *testing.T) {
	hosts := labHosts("/var/lib/labcloud/lab", 3, Addressing{})
	cfg := routerConfig(hosts, false, Addressing{})
	if len(cfg.Neighbors) != 3 {
		t.Fatalf("%d neighbours, want 3", len(cfg.Neighbors))
	}
	for i, n := range cfg.Neighbors {
		if n.Address.String() != hosts[i].Address || !n.BFD || n.ASN != ccmASN || n.NextHopsAnywhere {
			t.Errorf("neighbour %d: %+v, want %s AS %d with BFD", i, n, hosts[i].Address, ccmASN)
		}
	}
}

// A routed lab: each host on a subnet of its own, its own guests' gateway,
// peering from its uplink; the router takes next hops on the hosts'
// subnets; each replica announces its VIPs, from a pool on no subnet.
func TestRoutedHosts(t *testing.T) {
	hosts := labHosts("/var/lib/labcloud/lab", 2, Addressing{})
	routeHosts(hosts, Addressing{})
	if hosts[0].Address != Gateway || hosts[1].Address != "10.123.2.1" || hosts[1].Uplink != "10.123.250.2" {
		t.Fatalf("routed hosts %+v", hosts)
	}
	x, err := hostNetwork(hosts[1], 2, defaults.Of(IPv4)).XML()
	if err != nil {
		t.Fatal(err)
	}
	var n libvirtxml.Network
	if err := n.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	if n.IPs[0].Address != "10.123.2.1" || n.DnsmasqOptions == nil || len(n.DnsmasqOptions.Option) != 1 || len(n.IPs[0].DHCP.Hosts) == 0 || n.IPs[0].DHCP.Hosts[0].IP != "10.123.2.101" {
		t.Errorf("host 2's network, want 10.123.2.1 as its guests' gateway, guest 2 at 10.123.2.101:\n%s", x)
	}
	for i, nb := range routerConfig(hosts, true, Addressing{}).Neighbors {
		if nb.Address.String() != hosts[i].Uplink || !nb.NextHopsAnywhere {
			t.Errorf("neighbour %d: %+v, want %s, next hops off the LAN accepted", i, nb, hosts[i].Uplink)
		}
	}
	cfg := labCloudConfig(defaults.Of(IPv4), true, hosts, hosts[1])
	if !cfg.BGP.AnnounceVIPs || cfg.BGP.RouterID != hosts[1].Uplink || cfg.BGP.Peers[0].Address != "10.123.250.254" {
		t.Errorf("host 2's BGP %+v, want VIPs announced from its uplink to the router", cfg.BGP)
	}
	if len(cfg.LoadBalancer.Pools) != 1 || !strings.HasPrefix(cfg.LoadBalancer.Pools[0].Addresses[0], "10.123.240.") {
		t.Errorf("routed pools %+v, want one off every host's subnet", cfg.LoadBalancer.Pools)
	}
}

// The first host's CCM reaches every other host over ssh, with the key
// and known_hosts grantSSH made; a replica reaches every host through its
// libvirtd's socket. The first host's config loads while both files are
// there, and not without its known_hosts.
func TestFirstHostReachesOthersOverSSH(t *testing.T) {
	dir := t.TempDir()
	key, known := filepath.Join(dir, "id_ed25519"), filepath.Join(dir, "known_hosts")
	for _, f := range []string{key, known} {
		if err := os.WriteFile(f, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hosts := labHosts("/var/lib/labcloud/lab", 3, Addressing{})
	for i := 1; i < len(hosts); i++ {
		hosts[i].SSHURI = libvirtd.SSHURI(hosts[i].Address, key, known)
	}
	uris := func(self Host) []string {
		var out []string
		for _, h := range labCloudConfig(defaults.Of(IPv4), true, hosts, self).Hypervisors {
			out = append(out, h.URI)
		}
		return out
	}
	if got, want := uris(hosts[0]), []string{labURI, hosts[1].SSHURI, hosts[2].SSHURI}; !slices.Equal(got, want) {
		t.Errorf("the first host's CCM reaches %q, want %q", got, want)
	}
	if got, want := uris(hosts[1]), []string{labURI, hosts[1].URI, hosts[2].URI}; !slices.Equal(got, want) {
		t.Errorf("the second host's replica reaches %q, want %q", got, want)
	}
	data, err := marshalCloudConfig(labCloudConfig(defaults.Of(IPv4), true, hosts, hosts[0]))
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "cloud-config.yaml", string(data))
	cfg, err := provider.LoadConfigFile(path)
	if err != nil {
		t.Fatalf("the first host's cloud config: %v", err)
	}
	if err := cfg.CheckHypervisorFiles(); err != nil {
		t.Fatalf("the first host's cloud config's files: %v", err)
	}
	if err := os.Remove(known); err != nil {
		t.Fatal(err)
	}
	if err := cfg.CheckHypervisorFiles(); err == nil || !strings.Contains(err.Error(), "known_hosts "+known) {
		t.Errorf("without %s: %v, want an error naming it", known, err)
	}
}
