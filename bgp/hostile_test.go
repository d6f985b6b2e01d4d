package bgp

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/internal/nstest"
)

// A hostile (or careless) peer: a BGP speaker written here, on the
// router's LAN, that sends the CCM's speaker thousands of routes, odd and
// malformed attributes, and one of the speaker's own prefixes. The
// speaker must keep none, pass none to its other peer (FRR), keep
// announcing its own routes to both, and its memory must stay flat.
const hostileASN = 64999

var hostileAddr = netip.MustParseAddr("192.0.2.3")

func TestHostilePeer(t *testing.T) {
	l := newLab(t, false)
	nstest.IP(t, "-n", l.routerNS, "addr", "add", "192.0.2.3/24", "dev", "r0", "nodad")
	ln := listenIn(t, l.routerNS, netip.AddrPortFrom(hostileAddr, 1179))
	l.opts.Peers = append(l.opts.Peers, Peer{Address: hostileAddr, ASN: hostileASN, Port: 1179})
	sp := l.startSpeaker()
	own := []Route{{netip.MustParsePrefix("10.244.1.0/24"), node1}, {netip.MustParsePrefix("fd00:244:1::/64"), node1v6}}
	sp.announce(own...)
	// Reported from the start, for each peer: what the lab's acceptance
	// check greps for.
	for _, peer := range []netip.Addr{routerAddr, hostileAddr} {
		if m := sp.acceptedMetric(peer); m != "0" {
			t.Errorf("labcloud_bgp_accepted_routes{peer=%q} = %q once the peer is configured, want 0", peer, m)
		}
	}
	h := acceptPeer(t, ln)
	l.waitRIB("ip", 20*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) })
	h.waitRoutes(10*time.Second, own)
	before := sp.memory()

	// 1,500 /32s, 1,500 /24s, 500 IPv6 /128s, one of the speaker's own
	// prefixes and a more specific one, and odd attributes.
	var v4, v6 []netip.Prefix
	for i := range 1500 {
		v4 = append(v4, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 32),
			netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64 + byte(i>>8), byte(i), 0}), 24))
	}
	for i := range 500 {
		v6 = append(v6, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 14: byte(i >> 8), 15: byte(i)}), 128))
	}
	h.send(updates(v4, nil)...)
	h.send(updates(v6, nil)...)
	h.send(oddUpdates(t)...)
	h.send(gobgp.NewEndOfRib(gobgp.RF_IPv4_UC), gobgp.NewEndOfRib(gobgp.RF_IPv6_UC))
	sent := len(v4) + len(v6)

	var hostile Session
	deadline := time.Now().Add(30 * time.Second)
	for hostile.Received < uint64(sent) {
		if time.Now().After(deadline) {
			t.Fatalf("the speaker holds %d of the %d routes the hostile peer sent after 30 s", hostile.Received, sent)
		}
		time.Sleep(200 * time.Millisecond)
		hostile = sp.session(hostileAddr)
	}
	time.Sleep(2 * time.Second) // time to re-advertise, were it to
	after := sp.memory()
	for _, s := range sp.sessions() {
		if s.Accepted != 0 {
			t.Errorf("the speaker accepted %d routes from %s (received %d)", s.Accepted, s.Peer, s.Received)
		}
		if m := sp.acceptedMetric(s.Peer); m != "0" {
			t.Errorf("labcloud_bgp_accepted_routes{peer=%q} = %q, want 0", s.Peer, m)
		}
	}
	for fam, want := range map[string][]string{"ip": {"10.244.1.0/24"}, "ipv6": {"fd00:244:1::/64"}} {
		rib, err := l.router.BGPRoutes(t.Context(), fam)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for p := range rib {
			got = append(got, p.String())
		}
		if slices.Sort(got); !slices.Equal(got, want) {
			t.Errorf("the other peer's %s BGP routes: %d (%v...), want only the speaker's own %v", fam, len(got), got[:min(len(got), 3)], want)
		}
	}
	l.waitRIB("ip", time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) })
	h.waitRoutes(time.Second, own)
	heap, rss := after.Heap-before.Heap, after.RSS-before.RSS
	t.Logf("hostile peer sent %d routes (+ %d odd), the speaker holds %d and accepted %d; heap %+.1f MiB, RSS %+.1f MiB",
		sent, len(oddUpdates(t)), hostile.Received, hostile.Accepted, mib(heap), mib(rss))
	if heap > 16<<20 {
		t.Errorf("the speaker's heap grew by %.1f MiB for %d routes it does not keep", mib(heap), sent)
	}

	// Past the prefix limit: the hostile session is shut, what it sent
	// dropped, and the other session goes on.
	var more []netip.Prefix
	for i := range maxPrefixes {
		more = append(more, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 32))
	}
	h.send(updates(more, nil)...)
	h.waitNotification(10*time.Second, gobgp.BGP_ERROR_CEASE, gobgp.BGP_ERROR_SUB_MAXIMUM_NUMBER_OF_PREFIXES_REACHED)
	if st, err := l.router.NeighborState(t.Context(), speakerAddr); err != nil || st != "Established" {
		t.Errorf("the other peer's session: %q (%v), want Established", st, err)
	}
	l.waitRIB("ip", time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) && len(rib) == 1 })
	if s := sp.session(hostileAddr); s.Received != 0 {
		t.Errorf("the speaker still holds %d routes from the peer it shut", s.Received)
	}
	// What the peer sent after the limit may still be on its way
	// through GoBGP's queues for a moment.
	var shut memUse
	for range 10 {
		if shut = sp.memory(); shut.Heap-before.Heap <= 4<<20 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("past the limit of %d: session shut, heap %+.1f MiB, RSS %+.1f MiB from before the peer sent anything", maxPrefixes, mib(shut.Heap-before.Heap), mib(shut.RSS-before.RSS))
	if d := shut.Heap - before.Heap; d > 4<<20 {
		t.Errorf("the speaker's heap is %.1f MiB above what it was before the peer sent anything, 5 s after shutting it", mib(d))
	}

	// The shut peer is let back (its first failure costs no hold); an
	// UPDATE whose attributes overrun it resets that session alone.
	shutAt := time.Now()
	h = acceptPeer(t, ln)
	h.waitRoutes(10*time.Second, own)
	t.Logf("the shut peer was let back %s later", time.Since(shutAt).Round(100*time.Millisecond))
	b, err := updates(v4[:1], nil)[0].Serialize()
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint16(b[gobgp.BGP_HEADER_LENGTH+2:], 0xfff0) // total path attribute length
	h.sendRaw(b)
	h.waitNotification(10*time.Second, gobgp.BGP_ERROR_UPDATE_MESSAGE_ERROR, gobgp.BGP_ERROR_SUB_MALFORMED_ATTRIBUTE_LIST)
	time.Sleep(time.Second)
	if st, err := l.router.NeighborState(t.Context(), speakerAddr); err != nil || st != "Established" {
		t.Errorf("the other peer's session after a malformed UPDATE from the hostile one: %q (%v), want Established", st, err)
	}
	l.waitRIB("ip", time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) && len(rib) == 1 })
}

// waitNotification waits for the speaker's NOTIFICATION ending the session.
func (p *rawPeer) waitNotification(within time.Duration, code, subcode uint8) {
	p.t.Helper()
	select {
	case n := <-p.notified:
		if n.ErrorCode != code || n.ErrorSubcode != subcode {
			p.t.Errorf("the speaker's NOTIFICATION: %d/%d, want %d/%d", n.ErrorCode, n.ErrorSubcode, code, subcode)
		}
	case <-time.After(within):
		p.t.Fatalf("no NOTIFICATION from the speaker in %s, want %d/%d", within, code, subcode)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// listenIn listens on TCP at addr inside the named network namespace;
// the socket stays in it whichever thread uses it.
func listenIn(t *testing.T, ns string, addr netip.AddrPort) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	nstest.InNamed(t, ns, func() { ln, err = net.Listen("tcp", addr.String()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// rawPeer is one session of the hostile peer with the speaker.
type rawPeer struct {
	t        *testing.T
	conn     net.Conn
	mu       sync.Mutex
	got      map[netip.Prefix]bool // routes the speaker announces to it
	notified chan *gobgp.BGPNotification
}

// acceptPeer takes the speaker's next connection and opens the session.
func acceptPeer(t *testing.T, ln net.Listener) *rawPeer {
	t.Helper()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(40 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the speaker did not connect to the hostile peer: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if m, err := readMessage(conn); err != nil || m.Header.Type != gobgp.BGP_MSG_OPEN {
		t.Fatalf("the speaker's first message: %v, %v; want an OPEN", m, err)
	}
	open, err := gobgp.NewBGPOpenMessage(hostileASN, 90, hostileAddr, []gobgp.OptionParameterInterface{
		gobgp.NewOptionParameterCapability([]gobgp.ParameterCapabilityInterface{
			gobgp.NewCapMultiProtocol(gobgp.RF_IPv4_UC), gobgp.NewCapMultiProtocol(gobgp.RF_IPv6_UC), gobgp.NewCapFourOctetASNumber(hostileASN),
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, conn: conn, got: map[netip.Prefix]bool{}, notified: make(chan *gobgp.BGPNotification, 1)}
	p.send(open, gobgp.NewBGPKeepAliveMessage())
	go p.read()
	return p
}

// read records what the speaker announces and withdraws, and its
// NOTIFICATION, until the session ends.
func (p *rawPeer) read() {
	for {
		m, err := readMessage(p.conn)
		if err != nil {
			return
		}
		switch b := m.Body.(type) {
		case *gobgp.BGPNotification:
			p.notified <- b
			return
		case *gobgp.BGPUpdate:
			p.mu.Lock()
			for _, n := range b.WithdrawnRoutes {
				delete(p.got, nlriPrefix(n.NLRI))
			}
			for _, n := range b.NLRI {
				p.got[nlriPrefix(n.NLRI)] = true
			}
			for _, a := range b.PathAttributes {
				switch a := a.(type) {
				case *gobgp.PathAttributeMpReachNLRI:
					for _, n := range a.Value {
						p.got[nlriPrefix(n.NLRI)] = true
					}
				case *gobgp.PathAttributeMpUnreachNLRI:
					for _, n := range a.Value {
						delete(p.got, nlriPrefix(n.NLRI))
					}
				}
			}
			p.mu.Unlock()
		}
	}
}

func nlriPrefix(n gobgp.NLRI) netip.Prefix {
	return netip.MustParsePrefix(n.String())
}

// waitRoutes waits until the speaker announces exactly want to the peer.
func (p *rawPeer) waitRoutes(within time.Duration, want []Route) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		p.mu.Lock()
		ok := len(p.got) == len(want)
		for _, r := range want {
			ok = ok && p.got[r.Prefix]
		}
		got := len(p.got)
		p.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("the speaker announces %d routes to the hostile peer after %s, want its own %v", got, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *rawPeer) send(msgs ...*gobgp.BGPMessage) {
	p.t.Helper()
	for _, m := range msgs {
		b, err := m.Serialize()
		if err != nil {
			p.t.Fatal(err)
		}
		p.sendRaw(b)
	}
}

func (p *rawPeer) sendRaw(b []byte) {
	p.t.Helper()
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := p.conn.Write(b); err != nil {
		p.t.Fatalf("hostile peer: %v", err)
	}
}

func readMessage(r io.Reader) (*gobgp.BGPMessage, error) {
	buf := make([]byte, gobgp.BGP_HEADER_LENGTH, 4096)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(buf[16:18]))
	if n < gobgp.BGP_HEADER_LENGTH {
		return nil, fmt.Errorf("message length %d", n)
	}
	buf = append(buf, make([]byte, n-gobgp.BGP_HEADER_LENGTH)...)
	if _, err := io.ReadFull(r, buf[gobgp.BGP_HEADER_LENGTH:]); err != nil {
		return nil, err
	}
	return gobgp.ParseBGPMessage(buf)
}

// updates announces prefixes (of one family) from the hostile peer, many
// to a message, with its plain attributes and extra ones.
func updates(prefixes []netip.Prefix, extra []gobgp.PathAttributeInterface) []*gobgp.BGPMessage {
	var msgs []*gobgp.BGPMessage
	for chunk := range slices.Chunk(prefixes, 150) {
		nlri := make([]gobgp.PathNLRI, 0, len(chunk))
		for _, p := range chunk {
			n, err := gobgp.NewIPAddrPrefix(p)
			if err != nil {
				panic(err)
			}
			nlri = append(nlri, gobgp.PathNLRI{NLRI: n})
		}
		attrs := []gobgp.PathAttributeInterface{
			gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP),
			gobgp.NewPathAttributeAsPath([]gobgp.AsPathParamInterface{gobgp.NewAs4PathParam(gobgp.BGP_ASPATH_ATTR_TYPE_SEQ, []uint32{hostileASN})}),
		}
		for _, a := range extra { // in place of a plain one of its type
			if i := slices.IndexFunc(attrs, func(b gobgp.PathAttributeInterface) bool { return b.GetType() == a.GetType() }); i >= 0 {
				attrs[i] = a
			} else {
				attrs = append(attrs, a)
			}
		}
		if chunk[0].Addr().Is4() {
			hop, _ := gobgp.NewPathAttributeNextHop(hostileAddr)
			msgs = append(msgs, gobgp.NewBGPUpdateMessage(nil, append(attrs, hop), nlri))
			continue
		}
		reach, err := gobgp.NewPathAttributeMpReachNLRI(gobgp.RF_IPv6_UC, nlri, netip.MustParseAddr("2001:db8::3"))
		if err != nil {
			panic(err)
		}
		msgs = append(msgs, gobgp.NewBGPUpdateMessage(nil, append(attrs, reach), nil))
	}
	return msgs
}

// oddUpdates are routes a careless or hostile peer might send: the
// speaker's own prefix and a more specific one, a default route,
// martians, and odd attributes; the last ones malformed in ways RFC 7606
// treats as a withdrawal.
func oddUpdates(t *testing.T) []*gobgp.BGPMessage {
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	longPath := make([]uint32, 250)
	communities := make([]uint32, 500)
	large := make([]*gobgp.LargeCommunity, 100)
	for i := range longPath {
		longPath[i] = uint32(64000 + i)
	}
	for i := range communities {
		communities[i] = uint32(hostileASN<<16 | i)
	}
	for i := range large {
		large[i] = gobgp.NewLargeCommunity(hostileASN, uint32(i), uint32(i))
	}
	originator, err := gobgp.NewPathAttributeOriginatorId(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := gobgp.NewPathAttributeClusterList([]netip.Addr{speakerAddr})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*gobgp.BGPMessage
	for _, u := range []struct {
		prefixes []netip.Prefix
		extra    []gobgp.PathAttributeInterface
	}{
		{pfx("10.244.1.0/24", "10.244.1.0/25", "0.0.0.0/0", "127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"), nil},
		{pfx("203.0.113.1/32"), []gobgp.PathAttributeInterface{gobgp.NewPathAttributeAsPath([]gobgp.AsPathParamInterface{
			gobgp.NewAs4PathParam(gobgp.BGP_ASPATH_ATTR_TYPE_SEQ, longPath), gobgp.NewAs4PathParam(gobgp.BGP_ASPATH_ATTR_TYPE_SET, []uint32{1, 2, 3})})}},
		{pfx("203.0.113.2/32"), []gobgp.PathAttributeInterface{gobgp.NewPathAttributeCommunities(communities), gobgp.NewPathAttributeLargeCommunities(large)}},
		{pfx("203.0.113.3/32"), []gobgp.PathAttributeInterface{gobgp.NewPathAttributeUnknown(gobgp.BGP_ATTR_FLAG_OPTIONAL|gobgp.BGP_ATTR_FLAG_TRANSITIVE, 240, make([]byte, 1500))}},
		{pfx("203.0.113.4/32"), []gobgp.PathAttributeInterface{originator, cluster, gobgp.NewPathAttributeLocalPref(1 << 31)}},
		// Malformed: ORIGIN 5 and a 3-byte MULTI_EXIT_DISC.
		{pfx("203.0.113.5/32"), []gobgp.PathAttributeInterface{gobgp.NewPathAttributeUnknown(gobgp.BGP_ATTR_FLAG_TRANSITIVE, gobgp.BGP_ATTR_TYPE_ORIGIN, []byte{5})}},
		{pfx("203.0.113.6/32"), []gobgp.PathAttributeInterface{gobgp.NewPathAttributeUnknown(gobgp.BGP_ATTR_FLAG_OPTIONAL, gobgp.BGP_ATTR_TYPE_MULTI_EXIT_DISC, []byte{1, 2, 3})}},
	} {
		msgs = append(msgs, updates(u.prefixes, u.extra)...)
	}
	return msgs
}

// memUse is the speaker process's memory: its live heap after a
// collection, and its resident set.
type memUse struct{ Heap, RSS int64 }

// memory measures the memory of this process (the speaker's).
func memory() string {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := memUse{Heap: int64(ms.HeapAlloc)}
	status, _ := os.ReadFile("/proc/self/status")
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			m.RSS = kb << 10
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (p *speakerProc) memory() memUse {
	p.t.Helper()
	var m memUse
	if err := json.Unmarshal([]byte(p.do("mem")), &m); err != nil {
		p.t.Fatal(err)
	}
	return m
}

func (p *speakerProc) sessions() []Session {
	p.t.Helper()
	var s []Session
	if err := json.Unmarshal([]byte(p.do("sessions")), &s); err != nil {
		p.t.Fatal(err)
	}
	return s
}

func (p *speakerProc) session(peer netip.Addr) Session {
	p.t.Helper()
	for _, s := range p.sessions() {
		if s.Peer == peer {
			return s
		}
	}
	p.t.Fatalf("the speaker has no session with %s", peer)
	return Session{}
}

// bgpMetrics is this process's labcloud_bgp_* samples, as /metrics shows
// them, as JSON.
func bgpMetrics() string {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return "error: " + err.Error()
	}
	var text bytes.Buffer
	for _, mf := range families {
		if strings.HasPrefix(mf.GetName(), "labcloud_bgp_") {
			if _, err := testutil.MetricFamilyToText(&text, mf); err != nil {
				return "error: " + err.Error()
			}
		}
	}
	var samples []string
	for line := range strings.Lines(text.String()) {
		if !strings.HasPrefix(line, "#") {
			samples = append(samples, strings.TrimSpace(line))
		}
	}
	b, _ := json.Marshal(samples)
	return string(b)
}

// acceptedMetric is the speaker's labcloud_bgp_accepted_routes for peer,
// empty if there is none.
func (p *speakerProc) acceptedMetric(peer netip.Addr) string {
	p.t.Helper()
	var samples []string
	if err := json.Unmarshal([]byte(p.do("metrics")), &samples); err != nil {
		p.t.Fatal(err)
	}
	for _, s := range samples {
		if v, ok := strings.CutPrefix(s, fmt.Sprintf("labcloud_bgp_accepted_routes{peer=%q} ", peer.String())); ok {
			return v
		}
	}
	return ""
}
