package uplink

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestClashes(t *testing.T) {
	pods := Named{What: "pod CIDRs", Prefix: netip.MustParsePrefix("10.244.0.0/16")}
	net4 := Named{What: "network", Prefix: netip.MustParsePrefix("10.123.0.0/24")}
	pods6 := Named{What: "IPv6 pod CIDRs", Prefix: netip.MustParsePrefix("fd00:10:244::/56")}
	lab := []Named{net4, pods, pods6}
	route := func(p, dev string) HostRoute { return HostRoute{Prefix: netip.MustParsePrefix(p), Dev: dev} }
	for _, tc := range []struct {
		name string
		host []HostRoute
		want []string
	}{
		{"a host of its own", []HostRoute{route("192.0.2.0/24", "eth0"), route("fd00::/64", "eth0")}, nil},
		{"the same prefix", []HostRoute{route("10.244.0.0/16", "cni0")},
			[]string{"the lab's pod CIDRs 10.244.0.0/16 and the host's route 10.244.0.0/16 dev cni0 overlap"}},
		{"a narrower host route", []HostRoute{route("10.244.3.0/24", "cni0")},
			[]string{"the lab's pod CIDRs 10.244.0.0/16 and the host's route 10.244.3.0/24 dev cni0 overlap"}},
		{"a wider host route (a VPN's 10/8) clashes with both", []HostRoute{route("10.0.0.0/8", "tun0")},
			[]string{"the lab's network 10.123.0.0/24 and the host's route 10.0.0.0/8 dev tun0 overlap",
				"the lab's pod CIDRs 10.244.0.0/16 and the host's route 10.0.0.0/8 dev tun0 overlap"}},
		{"IPv6", []HostRoute{route("fd00:10:244:5::/64", "br6")},
			[]string{"the lab's IPv6 pod CIDRs fd00:10:244::/56 and the host's route fd00:10:244:5::/64 dev br6 overlap"}},
		{"the transit", []HostRoute{route("169.254.123.0/24", "eth1")},
			[]string{"the lab's uplink's transit 169.254.123.0/30 and the host's route 169.254.123.0/24 dev eth1 overlap"}},
		{"default routes, link-local and zeroconf are no clash",
			[]HostRoute{route("0.0.0.0/0", "eth0"), route("::/0", "eth0"), route("fe80::/64", "eth0"), route("169.254.0.0/16", "eth0")}, nil},
		{"the lab's leftovers are no clash", []HostRoute{
			{Prefix: netip.MustParsePrefix("10.244.0.0/16"), Dev: "eth9", Protocol: Protocol},
			route("10.123.0.0/24", HostLink)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clashes(lab, tc.host); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Clashes:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// A clash of a prefix a flag moves names the flag, and the refusal says
// to use it.
func TestClashNamesTheFlag(t *testing.T) {
	lab := []Named{
		{What: "network", Prefix: netip.MustParsePrefix("10.123.0.0/24"), Flag: "--subnet"},
		{What: "pod CIDRs", Prefix: netip.MustParsePrefix("10.244.0.0/16"), Flag: "--pod-cidr"},
	}
	host := []HostRoute{{Prefix: netip.MustParsePrefix("10.244.0.0/16"), Dev: "flannel.1"}, {Prefix: netip.MustParsePrefix("10.123.0.0/24"), Dev: "br9"}}
	want := []string{
		"the lab's pod CIDRs 10.244.0.0/16 and the host's route 10.244.0.0/16 dev flannel.1 overlap (labcloud up --pod-cidr moves the lab's)",
		"the lab's network 10.123.0.0/24 and the host's route 10.123.0.0/24 dev br9 overlap (labcloud up --subnet moves the lab's)",
	}
	got := Clashes(lab, host)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Clashes:\n got %q\nwant %q", got, want)
	}
	if err := (&ClashError{Clashes: got}).Error(); !strings.Contains(err, "--pod-cidr moves") || strings.Contains(err, "fixed") {
		t.Errorf("refusal %q, want the flags named and no word of the addresses being fixed", err)
	}
}
