package bgp

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

func route(prefix, hop string) Route {
	return Route{netip.MustParsePrefix(prefix), netip.MustParseAddr(hop)}
}

func TestDiffRoutes(t *testing.T) {
	announced := map[netip.Prefix]netip.Addr{
		netip.MustParsePrefix("10.244.1.0/24"): netip.MustParseAddr("10.0.0.11"),
		netip.MustParsePrefix("10.244.2.0/24"): netip.MustParseAddr("10.0.0.12"),
		netip.MustParsePrefix("10.244.3.0/24"): netip.MustParseAddr("10.0.0.13"),
	}
	for _, tc := range []struct {
		name         string
		desired      []Route
		wantAnnounce []Route
		wantWithdraw []string
	}{
		{"unchanged", []Route{route("10.244.1.0/24", "10.0.0.11"), route("10.244.2.0/24", "10.0.0.12"), route("10.244.3.0/24", "10.0.0.13")}, nil, nil},
		{"next hop moved", []Route{route("10.244.1.0/24", "10.0.0.99"), route("10.244.2.0/24", "10.0.0.12"), route("10.244.3.0/24", "10.0.0.13")},
			[]Route{route("10.244.1.0/24", "10.0.0.99")}, nil},
		{"node gone, node new", []Route{route("10.244.1.0/24", "10.0.0.11"), route("10.244.3.0/24", "10.0.0.13"), route("fd00:244:4::/64", "fd00::14")},
			[]Route{route("fd00:244:4::/64", "fd00::14")}, []string{"10.244.2.0/24"}},
		{"everything withdrawn", nil, nil, []string{"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := diffRoutes(announced, tc.desired)
			var withdraw []string
			for _, p := range d.withdraw {
				withdraw = append(withdraw, p.String())
			}
			if !reflect.DeepEqual(d.announce, tc.wantAnnounce) || !reflect.DeepEqual(withdraw, tc.wantWithdraw) {
				t.Errorf("diff = announce %v withdraw %v, want announce %v withdraw %v", d.announce, withdraw, tc.wantAnnounce, tc.wantWithdraw)
			}
		})
	}
}

func TestNormalizeRefusesOnlyTheBadRoute(t *testing.T) {
	good := route("10.244.3.0/24", "10.0.0.3")
	for _, tc := range []struct {
		bad  Route
		want string
	}{
		{route("10.244.1.0/24", "fd00::1"), "different families"},
		{route("10.244.1.7/24", "10.0.0.1"), "host bits"},
		{route("10.244.1.0/24", "127.0.0.1"), "unicast"},
		{route("10.244.1.0/24", "fe80::1"), "unicast"},
		{Route{Prefix: netip.MustParsePrefix("10.244.1.0/24")}, "unicast"},
	} {
		got, refused := normalize([]Route{tc.bad, good}, nil)
		if !reflect.DeepEqual(got, []Route{good}) || len(refused) != 1 || !strings.Contains(refused[0], tc.want) {
			t.Errorf("normalize(%v, %v) = %v, refused %q; want %v and one refusal saying %q", tc.bad, good, got, refused, good, tc.want)
		}
	}
	got, refused := normalize([]Route{route("10.244.2.0/24", "10.0.0.2"), route("10.244.1.0/24", "10.0.0.1"), route("10.244.2.0/24", "10.0.0.2")}, nil)
	if len(refused) != 0 || !reflect.DeepEqual(got, []Route{route("10.244.1.0/24", "10.0.0.1"), route("10.244.2.0/24", "10.0.0.2")}) {
		t.Errorf("normalize of a repeated route = %v, refused %q; want it once, sorted", got, refused)
	}
}

// A prefix given two next hops (two Services' conditions naming one VIP
// with different nodes) costs only that prefix, and never moves it: it
// keeps the next hop it is announced with, if that is one of them.
func TestNormalizeConflictingNextHops(t *testing.T) {
	vip, other := netip.MustParsePrefix("192.0.2.5/32"), route("10.244.1.0/24", "10.0.0.1")
	a, b, c := netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("10.0.0.12"), netip.MustParseAddr("10.0.0.13")
	for _, tc := range []struct {
		name      string
		announced map[netip.Prefix]netip.Addr
		want      []Route
		says      string
	}{
		{"new prefix: not announced", nil, []Route{other}, "not announced"},
		{"announced via one of them: kept", map[netip.Prefix]netip.Addr{vip: b}, []Route{other, {vip, b}}, "keeps 10.0.0.12"},
		{"announced via neither: withdrawn", map[netip.Prefix]netip.Addr{vip: c}, []Route{other}, "not announced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := normalize([]Route{{vip, a}, other, {vip, b}, {vip, a}}, tc.announced)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("routes = %v, want %v", got, tc.want)
			}
			if len(refused) != 1 || !strings.Contains(refused[0], "192.0.2.5/32 given next hops 10.0.0.11 and 10.0.0.12") || !strings.Contains(refused[0], tc.says) {
				t.Errorf("refused = %q, want one line naming 192.0.2.5/32, both next hops, and saying %q", refused, tc.says)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{ASN: 64513, RouterID: netip.MustParseAddr("10.0.0.1"),
		Peers: []Peer{{Address: netip.MustParseAddr("10.0.0.254"), ASN: 64512}}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for _, tc := range []struct {
		change func(*Options)
		want   string
	}{
		{func(o *Options) { o.ASN = 0 }, "asn: required"},
		{func(o *Options) { o.RouterID = netip.MustParseAddr("fd00::1") }, "routerID"},
		{func(o *Options) { o.Peers = nil }, "peers: at least one"},
		{func(o *Options) { o.Peers = append(o.Peers, o.Peers[0]) }, "peers[1].address: 10.0.0.254 is also peers[0]"},
		{func(o *Options) { o.Peers[0].ASN = 0 }, "peers[0].asn"},
		{func(o *Options) { o.Peers[0].HoldTime = time.Second }, "peers[0].holdTime"},
		{func(o *Options) { o.RestartTime = 2 * time.Hour }, "restartTime"},
	} {
		o := good
		o.Peers = append([]Peer(nil), good.Peers...)
		tc.change(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error saying %q", err, tc.want)
		}
	}
}

func TestAPIState(t *testing.T) {
	for fsm, want := range map[gobgp.FSMState]string{gobgp.BGP_FSM_IDLE: "idle", gobgp.BGP_FSM_ACTIVE: "active", gobgp.BGP_FSM_ESTABLISHED: "established"} {
		if got := sessionState(apiState(fsm)); got != want {
			t.Errorf("sessionState(apiState(%v)) = %q, want %q", fsm, got, want)
		}
	}
}
