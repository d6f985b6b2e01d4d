package provider

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/bgp"
	"github.com/labcloud/labcloud/lb"
)

func TestLoadConfigBGP(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(strings.NewReader(`
bgp:
  asn: 64513
  routerID: 10.0.0.1
  communities: ["64512:76"]
  restartTime: 90s
  peers:
    - {address: 10.0.0.254, asn: 64512, bfd: true, passwordFile: ` + pw + `, holdTime: 9s}
`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.BGP.SpeakerOptions()
	want := bgp.Options{ASN: 64513, RouterID: netip.MustParseAddr("10.0.0.1"), Communities: []uint32{64512<<16 | 76}, RestartTime: 90 * time.Second,
		Peers: []bgp.Peer{{Address: netip.MustParseAddr("10.0.0.254"), ASN: 64512, BFD: true, Password: "s3cret", HoldTime: 9 * time.Second}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("SpeakerOptions() = %+v, %v; want %+v", got, err, want)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{"/does/not/exist", `bgp.peers[0].passwordFile: "/does/not/exist" open /does/not/exist: no such file`},
		{empty, `bgp.peers[0].passwordFile: "` + empty + `" is empty`},
	} {
		cfg := c.BGP
		cfg.Peers = []BGPPeerConfig{{Address: "10.0.0.254", ASN: 64512, PasswordFile: tc.file}}
		if _, err := cfg.SpeakerOptions(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("password file %s: err = %v, want %q", tc.file, err, tc.want)
		}
	}

	for yaml, want := range map[string]string{
		"bgp: {asn: 1, routerID: 10.0.0.1}":                                                               "bgp.peers: at least one peer",
		"bgp: {routerID: 10.0.0.1, peers: [{address: 10.0.0.2, asn: 2}]}":                                 "bgp.asn: required",
		"bgp: {asn: 1, routerID: fd00::1, peers: [{address: 10.0.0.2, asn: 2}]}":                          "bgp.routerID",
		"bgp: {asn: 1, routerID: router, peers: [{address: 10.0.0.2, asn: 2}]}":                           `bgp.routerID: "router" is not an IPv4 address`,
		"bgp: {asn: 1, routerID: 10.0.0.1, peers: [{address: gw, asn: 2}]}":                               `bgp.peers[0].address: "gw" is not an IP address`,
		"bgp: {asn: 1, routerID: 10.0.0.1, peers: [{address: 10.0.0.2}]}":                                 "bgp.peers[0].asn: required",
		"bgp: {asn: 1, routerID: 10.0.0.1, peers: [{address: 10.0.0.2, asn: 2, holdTime: 1s}]}":           "bgp.peers[0].holdTime",
		"bgp: {asn: 1, routerID: 10.0.0.1, communities: [65536:1], peers: [{address: 10.0.0.2, asn: 2}]}": `bgp.communities[0]: "65536:1" is not "ASN:value"`,
		"bgp: {asn: 1, routerID: 10.0.0.1, restartTime: 2h, peers: [{address: 10.0.0.2, asn: 2}]}":        "bgp.restartTime",
	} {
		if _, err := LoadConfig(strings.NewReader(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", yaml, err, want)
		}
	}
	if c, err := LoadConfig(strings.NewReader("region: r")); err != nil || c.BGP.Enabled() {
		t.Errorf("no bgp section: enabled %v, %v", c.BGP.Enabled(), err)
	}
}

func bgpNode(name string, created int, podCIDRs []string, ips ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(int64(created), 0)},
		Spec: v1.NodeSpec{PodCIDRs: podCIDRs}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: name})
	return n
}

func TestBGPRoutes(t *testing.T) {
	rules := podCIDRRules{cluster: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}}
	nodes := []*v1.Node{
		bgpNode("b-dual", 1, []string{"10.244.2.0/24", "fd00:244:0:2::/64"}, "10.0.0.12", "fd00::12"),
		bgpNode("a-v4", 1, []string{"10.244.1.0/24"}, "10.0.0.11"),
		bgpNode("c-no-v6-address", 1, []string{"10.244.3.0/24", "fd00:244:0:3::/64"}, "10.0.0.13"),
		bgpNode("d-outside", 1, []string{"10.99.4.0/24"}, "10.0.0.14"),
		bgpNode("e-newer-claim", 2, []string{"10.244.1.0/24"}, "10.0.0.15"),
		bgpNode("f-no-cidr", 1, nil, "10.0.0.16"),
	}
	everyNode := func(*v1.Node) bool { return true }
	routes, refused := bgpRoutes(nodes, rules, everyNode)
	r := func(p, hop string) bgp.Route {
		return bgp.Route{Prefix: netip.MustParsePrefix(p), NextHop: netip.MustParseAddr(hop)}
	}
	wantRoutes := []bgp.Route{r("10.244.1.0/24", "10.0.0.11"), r("10.244.2.0/24", "10.0.0.12"), r("fd00:244:0:2::/64", "fd00::12"), r("10.244.3.0/24", "10.0.0.13")}
	if !reflect.DeepEqual(routes, wantRoutes) {
		t.Errorf("routes = %v, want %v", routes, wantRoutes)
	}
	wantRefused := []string{
		"node c-no-v6-address pod CIDR fd00:244:0:3::/64: no IPv6 InternalIP to route it through",
		"node d-outside pod CIDR 10.99.4.0/24: not inside the cluster CIDR 10.244.0.0/16 (--cluster-cidr)",
		`node e-newer-claim pod CIDR 10.244.1.0/24: also claimed by node "a-v4", which keeps it (the oldest claiming Node, ties broken by name)`,
	}
	if !reflect.DeepEqual(refused, wantRefused) {
		t.Errorf("refused = %q, want %q", refused, wantRefused)
	}
	if routes, refused := bgpRoutes(nodes, podCIDRRules{}, everyNode); len(routes) != 0 || len(refused) != 7 {
		t.Errorf("without cluster CIDRs: routes %v, refused %q; want none announced, each CIDR refused", routes, refused)
	}
}

func TestRouteFieldsChanged(t *testing.T) {
	base := bgpNode("n", 1, []string{"10.244.1.0/24"}, "10.0.0.11")
	heartbeat := base.DeepCopy()
	heartbeat.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Unix(99, 0)}}
	newCIDR := base.DeepCopy()
	newCIDR.Spec.PodCIDRs = append(newCIDR.Spec.PodCIDRs, "fd00:244::/64")
	newIP := base.DeepCopy()
	newIP.Status.Addresses[0].Address = "10.0.0.99"
	// The CCM labels a Node's zone when it initializes it, which may come
	// after its pod CIDR: the zone says which host's replica announces it.
	zoned := base.DeepCopy()
	zoned.Labels = map[string]string{v1.LabelTopologyZone: "z1"}
	otherLabel := base.DeepCopy()
	otherLabel.Labels = map[string]string{"team": "a"}
	for name, tc := range map[string]struct {
		cur  *v1.Node
		want bool
	}{"heartbeat": {heartbeat, false}, "pod CIDR added": {newCIDR, true}, "InternalIP changed": {newIP, true},
		"zone labelled": {zoned, true}, "another label": {otherLabel, false}} {
		if got := routeFieldsChanged(base, tc.cur); got != tc.want {
			t.Errorf("%s: routeFieldsChanged = %v, want %v", name, got, tc.want)
		}
	}
}

// TestBGPRoutesOfThisHostOnly: with hypervisors on two hosts, each
// replica announces only the Nodes of its own host's zones, while a CIDR's
// owner is still decided over every Node.
func TestBGPRoutesOfThisHostOnly(t *testing.T) {
	cfg := resolvedOf(t, Config{Host: "kvm1", Hypervisors: []HypervisorConfig{
		{URI: "qemu:///system", Zone: "z1", Host: "kvm1"},
		{URI: "qemu+ssh://kvm2/system", Zone: "z2", Host: "kvm2"},
	}})
	inZone := func(n *v1.Node, zone string) *v1.Node {
		if zone != "" {
			n.Labels = map[string]string{v1.LabelTopologyZone: zone}
		}
		return n
	}
	nodes := []*v1.Node{
		inZone(bgpNode("a-kvm1", 1, []string{"10.244.1.0/24"}, "10.0.0.11"), "z1"),
		inZone(bgpNode("b-kvm2", 1, []string{"10.244.2.0/24"}, "10.0.0.12"), "z2"),
		inZone(bgpNode("c-kvm1-newer-claim", 2, []string{"10.244.2.0/24"}, "10.0.0.13"), "z1"),
		inZone(bgpNode("d-no-zone-yet", 1, []string{"10.244.4.0/24"}, "10.0.0.14"), ""),
	}
	rules := podCIDRRules{cluster: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	routes, _ := bgpRoutes(nodes, rules, cfg.onThisHost())
	want := []bgp.Route{{Prefix: netip.MustParsePrefix("10.244.1.0/24"), NextHop: netip.MustParseAddr("10.0.0.11")}}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("kvm1 announces %v, want %v (its own Node only; 10.244.2.0/24 is b-kvm2's, announced on kvm2)", routes, want)
	}
	cfg.Host = "kvm2"
	cfg = resolvedOf(t, cfg)
	routes, _ = bgpRoutes(nodes, rules, cfg.onThisHost())
	want = []bgp.Route{{Prefix: netip.MustParsePrefix("10.244.2.0/24"), NextHop: netip.MustParseAddr("10.0.0.12")}}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("kvm2 announces %v, want %v", routes, want)
	}

	// One host, even a remote one this CCM does not run on: every Node.
	one := resolvedOf(t, Config{Host: "ctl", Hypervisors: []HypervisorConfig{{URI: "qemu+ssh://kvm2/system", Zone: "z2", Host: "kvm2"}}})
	if routes, _ := bgpRoutes(nodes, rules, one.onThisHost()); len(routes) != 3 {
		t.Errorf("with one hypervisor host the CCM announces %v, want the 3 CIDRs of every Node", routes)
	}
}

// TestVIPRoutes: routed mode announces each VIP of a served Service as a
// host route via the node its Announced condition names, of the VIP's
// family, from that node's host only.
func TestVIPRoutes(t *testing.T) {
	cfg := resolvedOf(t, Config{Host: "kvm1", Hypervisors: []HypervisorConfig{
		{URI: "qemu:///system", Zone: "z1", Host: "kvm1"},
		{URI: "qemu+ssh://kvm2/system", Zone: "z2", Host: "kvm2"},
	}})
	zoned := func(n *v1.Node, zone string) *v1.Node {
		n.Labels = map[string]string{v1.LabelTopologyZone: zone}
		return n
	}
	nodes := []*v1.Node{
		zoned(bgpNode("a", 1, nil, "10.0.0.11", "fd00::11"), "z1"),
		zoned(bgpNode("b", 1, nil, "10.0.0.12"), "z2"),
		zoned(bgpNode("c-v4-only", 1, nil, "10.0.0.13"), "z1"),
	}
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	ip := netip.MustParseAddr
	svc := func(name string, answers ...lb.Answer) *v1.Service {
		var ingress []string
		for _, a := range answers {
			ingress = append(ingress, a.VIP.String())
		}
		return claiming("default", name, ingress, answers...)
	}
	classed := svc("classed", lb.Answer{VIP: ip("10.0.0.204"), Node: "a", MAC: mac})
	classed.Spec.LoadBalancerClass = ptr.To("example.com/other")
	services := []*v1.Service{
		svc("dual", lb.Answer{VIP: ip("10.0.0.200"), Node: "a", MAC: mac}, lb.Answer{VIP: ip("fd00::200"), Node: "a", MAC: mac}),
		svc("on-kvm2", lb.Answer{VIP: ip("10.0.0.201"), Node: "b", MAC: mac}),
		svc("unanswered", lb.Answer{VIP: ip("10.0.0.202")}),
		svc("no-v6-address", lb.Answer{VIP: ip("fd00::203"), Node: "c-v4-only", MAC: mac}),
		svc("outside-pools", lb.Answer{VIP: ip("192.0.2.1"), Node: "a", MAC: mac}),
		classed,
	}
	pools, err := lb.NewPools([]lb.PoolConfig{{Name: "test", Addresses: []string{"10.0.0.0/24", "fd00::/112"}}})
	if err != nil {
		t.Fatal(err)
	}
	answers, _ := trustedAnswers(services, claimRules{serves: LoadBalancerConfig{}.Serves, pools: pools})
	routes, refused := vipRoutes(answers, nodes, cfg.onThisHost())
	r := func(p, hop string) bgp.Route {
		return bgp.Route{Prefix: netip.MustParsePrefix(p), NextHop: netip.MustParseAddr(hop)}
	}
	if want := []bgp.Route{r("10.0.0.200/32", "10.0.0.11"), r("fd00::200/128", "fd00::11")}; !reflect.DeepEqual(routes, want) {
		t.Errorf("kvm1 announces %v, want %v", routes, want)
	}
	if want := []string{"VIP fd00::203: node c-v4-only has no IPv6 InternalIP to route it through"}; !reflect.DeepEqual(refused, want) {
		t.Errorf("refused %q, want %q", refused, want)
	}
	cfg.Host = "kvm2"
	cfg = resolvedOf(t, cfg)
	if routes, _ := vipRoutes(answers, nodes, cfg.onThisHost()); !reflect.DeepEqual(routes, []bgp.Route{r("10.0.0.201/32", "10.0.0.12")}) {
		t.Errorf("kvm2 announces %v, want 10.0.0.201/32 via b", routes)
	}
	if _, err := LoadConfig(strings.NewReader("bgp: {asn: 1, routerID: 10.0.0.1, announceVIPs: true, peers: [{address: 10.0.0.2, asn: 2}]}")); err == nil || !strings.Contains(err.Error(), "bgp.announceVIPs") {
		t.Errorf("announceVIPs without pools: err = %v, want one naming bgp.announceVIPs", err)
	}
}

// TestBGPLeavesConnectedSubnets: the BGP announcer, made as the CCM makes
// it in its own network namespace, announces no pod CIDR that overlaps a
// subnet connected to the host, as the routes path routes none: the
// router would send that subnet's traffic to a Node.
func TestBGPLeavesConnectedSubnets(t *testing.T) {
	l := newRtLab(t)
	l.ip(t, "link", "add", "other0", "type", "veth", "peer", "name", "other0-p")
	l.ip(t, "addr", "add", "10.244.9.1/24", "dev", "other0")
	cfg, err := LoadConfig(strings.NewReader("bgp: {asn: 64513, routerID: 192.168.77.1, peers: [{address: 192.168.77.2, asn: 64512}]}"))
	if err != nil {
		t.Fatal(err)
	}
	var a *bgpAnnouncer
	l.inNetns(t, func() { a, err = newBGPAnnouncer(&cfg, rtCluster) })
	if err != nil {
		t.Fatal(err)
	}
	a.nodes = nodeLister(t, rtNode("a", []string{"10.244.1.0/24"}, "192.168.77.11"), rtNode("c", []string{"10.244.9.0/24"}, "192.168.77.13"))
	routes, refused, _, err := a.desired(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []bgp.Route{{Prefix: netip.MustParsePrefix("10.244.1.0/24"), NextHop: netip.MustParseAddr("192.168.77.11")}}; !reflect.DeepEqual(routes, want) {
		t.Errorf("announced %v, want %v", routes, want)
	}
	if want := []string{"node c pod CIDR 10.244.9.0/24: overlaps 10.244.9.0/24, a subnet connected to this host"}; !reflect.DeepEqual(refused, want) {
		t.Errorf("refused %q, want %q", refused, want)
	}
}

// testMAC is a node's MAC: its name's last letter in the last byte.
func testMAC(name string) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0, 0, 0, name[len(name)-1]}
}

// TestBGPAnnouncesOnlyTrustedVIPs: in routed mode a forged claim (a VIP
// not in the claiming Service's ingress) and two Services claiming one VIP
// for different nodes cost only those VIPs: every other route, the pod
// CIDRs' and the other VIPs', is announced, and the conflict is never two
// routes to one prefix.
func TestBGPAnnouncesOnlyTrustedVIPs(t *testing.T) {
	nodes := []*v1.Node{bgpNode("n1", 1, []string{"10.244.1.0/24"}, "10.0.0.11"), bgpNode("n2", 1, []string{"10.244.2.0/24"}, "10.0.0.12")}
	on := func(vip, node string) lb.Answer {
		return lb.Answer{VIP: netip.MustParseAddr(vip), Node: node, MAC: testMAC(node)}
	}
	services := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range []*v1.Service{
		claiming("a", "web", []string{"10.0.0.201"}, on("10.0.0.201", "n1")),
		claiming("b", "forge", []string{"10.0.0.209"}, on("10.0.0.201", "n2")),
		claiming("b", "s1", []string{"10.0.0.204"}, on("10.0.0.204", "n1")),
		claiming("b", "s2", []string{"10.0.0.204"}, on("10.0.0.204", "n2")),
	} {
		if err := services.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	pools, err := lb.NewPools([]lb.PoolConfig{{Name: "test", Addresses: []string{"10.0.0.200-10.0.0.250"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	a := &bgpAnnouncer{cluster: rtCluster, onHost: func(*v1.Node) bool { return true }, nodes: nodeLister(t, nodes...),
		connected: func() ([]netip.Prefix, error) { return nil, nil },
		vips:      &claimReader{services: corelisters.NewServiceLister(services), rules: claimRules{serves: LoadBalancerConfig{}.Serves, pools: pools}, report: newClaimReporter(rec, 0)}}
	routes, _, recheck, err := a.desired(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := func(p, hop string) bgp.Route {
		return bgp.Route{Prefix: netip.MustParsePrefix(p), NextHop: netip.MustParseAddr(hop)}
	}
	if want := []bgp.Route{r("10.244.1.0/24", "10.0.0.11"), r("10.244.2.0/24", "10.0.0.12"), r("10.0.0.201/32", "10.0.0.11")}; !reflect.DeepEqual(routes, want) {
		t.Errorf("announced %v, want %v", routes, want)
	}
	if recheck || len(rec.Events) != 3 {
		t.Errorf("recheck %v, %d events; want the 3 refused claims told at once (no grace here)", recheck, len(rec.Events))
	}
}
