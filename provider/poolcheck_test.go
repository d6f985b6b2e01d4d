package provider

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

func TestCheckPools(t *testing.T) {
	a := netip.MustParseAddr
	taken := []reserved{
		{what: "address 10.77.0.1 of bridge labbr0", first: a("10.77.0.1"), last: a("10.77.0.1")},
		{what: `DHCP range 10.77.0.100-10.77.0.200 of libvirt network "labnet"`, first: a("10.77.0.100"), last: a("10.77.0.200")},
	}
	for _, tt := range []struct {
		name  string
		addrs []string
		want  []string // substrings of the error; none: no error
	}{
		{"clear of both", []string{"10.77.0.210-10.77.0.250"}, nil},
		{"inside the DHCP range", []string{"10.77.0.150-10.77.0.160"},
			[]string{`pool "p" (10.77.0.150-10.77.0.160)`, `DHCP range 10.77.0.100-10.77.0.200 of libvirt network "labnet"`}},
		{"edge of the DHCP range", []string{"10.77.0.200-10.77.0.210"}, []string{"DHCP range"}},
		{"the bridge's address", []string{"10.77.0.0/28"}, []string{`pool "p" (10.77.0.0/28)`, "address 10.77.0.1 of bridge labbr0"}},
		{"both", []string{"10.77.0.0/24"}, []string{"bridge labbr0", "DHCP range"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pools, err := lb.NewPools([]lb.PoolConfig{{Name: "p", Addresses: tt.addrs}})
			if err != nil {
				t.Fatal(err)
			}
			err = checkPools(pools, taken)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// The example cloud config on a host with libvirt's stock default network
// (DHCP 192.168.122.2-254): the pool must be refused, naming both; with the
// DHCP range narrowed as the example says, it passes.
func TestExamplePoolAgainstLibvirtDefaultNetwork(t *testing.T) {
	cfg, err := LoadConfigFile("../examples/cloud-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dhcpEnd string
		want    string
	}{
		{"192.168.122.254", `DHCP range 192.168.122.2-192.168.122.254 of libvirt network "default"`},
		{"192.168.122.199", ""},
	} {
		h := defaultNetworkHypervisor(t, tt.dhcpEnd)
		err := checkPoolsAtStart(context.Background(), "lc-no-such-br", cfg.ParsedPools(), []*libvirtcloud.Hypervisor{h})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("DHCP range up to %s: %v", tt.dhcpEnd, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `pool "lab"`)):
			t.Errorf("DHCP range up to %s: err = %v, want one naming pool \"lab\" and %s", tt.dhcpEnd, err, tt.want)
		}
	}
}

// defaultNetworkHypervisor is the test driver holding libvirt's default
// network (as /usr/share/libvirt/networks/default.xml ships it, with the
// DHCP range ending at dhcpEnd).
func defaultNetworkHypervisor(t *testing.T, dhcpEnd string) *libvirtcloud.Hypervisor {
	t.Helper()
	fixture := filepath.Join(t.TempDir(), "default-net.xml")
	xml := `<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>1</active><total>1</total><nodes>1</nodes><sockets>1</sockets><cores>1</cores><threads>1</threads></cpu>
  <memory>1048576</memory>
  <network>
    <name>default</name>
    <uuid>aaaaaaaa-0000-0000-0000-0000000000de</uuid>
    <bridge name='virbr0'/>
    <forward/>
    <ip address='192.168.122.1' netmask='255.255.255.0'><dhcp><range start='192.168.122.2' end='` + dhcpEnd + `'/></dhcp></ip>
  </network>
</node>`
	if err := os.WriteFile(fixture, []byte(xml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h, err := libvirtcloud.Open(ctx, libvirtcloud.Options{URI: "test://" + fixture, Zone: "z", Networks: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := h.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// The bridge's own address, read with netlink from a real bridge.
func TestBridgeAddressesAreReserved(t *testing.T) {
	nl := nstest.Handle(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lcpool0"}}
	if err := nl.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	ip, ipnet, _ := net.ParseCIDR("10.66.0.1/24")
	ipnet.IP = ip
	if err := nl.AddrAdd(br, &netlink.Addr{IPNet: ipnet}); err != nil {
		t.Fatal(err)
	}
	taken, err := bridgeAddresses(nl, "lcpool0")
	if err != nil {
		t.Fatal(err)
	}
	pools, err := lb.NewPools([]lb.PoolConfig{{Name: "edge", Addresses: []string{"10.66.0.0/29"}}})
	if err != nil {
		t.Fatal(err)
	}
	err = checkPools(pools, taken)
	if err == nil || !strings.Contains(err.Error(), "address 10.66.0.1 of bridge lcpool0") {
		t.Fatalf("err = %v, want one naming the bridge's address", err)
	}
}

// The network and broadcast addresses of the bridge's IPv4 subnets, read
// with netlink from a real bridge: a /24, a /30 and a /31 (no edges).
func TestSubnetEdges(t *testing.T) {
	nl := nstest.Handle(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lcedge0"}}
	if err := nl.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.168.50.1/24", "10.9.0.5/30", "10.8.0.0/31", "fd00::1/64"} {
		addr, _ := netlink.ParseAddr(a)
		if err := nl.AddrAdd(br, addr); err != nil {
			t.Fatal(err)
		}
	}
	got, err := subnetEdges(nl, "lcedge0")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	want := []netip.Addr{netip.MustParseAddr("10.9.0.4"), netip.MustParseAddr("10.9.0.7"),
		netip.MustParseAddr("192.168.50.0"), netip.MustParseAddr("192.168.50.255"), netip.MustParseAddr("fd00::")}
	if !slices.Equal(got, want) {
		t.Errorf("subnetEdges = %v, want %v", got, want)
	}
	if _, err := subnetEdges(nl, "nosuchbridge"); err == nil || !strings.Contains(err.Error(), "nosuchbridge") {
		t.Errorf("a missing bridge: %v, want an error naming it", err)
	}
}
