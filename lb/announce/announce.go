// Package announce makes one node answer for each load-balancer VIP on a bridge.
//
// The CCM runs on the host, attached to the bridge. For every VIP it owns it
// answers ARP requests that arrive on the bridge with the MAC of the node chosen
// to serve that VIP, sends gratuitous ARP when the choice is made or changes
// (and at start-up, when the bridge's link comes back, and on a slow timer), and
// installs a permanent host neighbour entry so the host itself reaches the VIP
// through that node. Addresses that are not currently owned VIPs are never
// answered.
//
// Frames are written with the chosen node's MAC as both the ARP sender hardware
// address and the Ethernet source, so switches behind the bridge learn the node's
// MAC on the right port; *arp.Client already does this (it takes the Ethernet
// source from the packet's sender hardware address), so no hand-built frames
// are needed.
package announce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Conn is the ARP I/O the Announcer needs. *arp.Client satisfies it; tests
// inject an *arp.Client over a loopback socket or a fake.
type Conn interface {
	// Read returns the next ARP packet and the Ethernet frame that carried it.
	Read() (*arp.Packet, *ethernet.Frame, error)
	// WriteTo sends p in an Ethernet frame to addr, with p's sender hardware
	// address as the frame's source.
	WriteTo(p *arp.Packet, addr net.HardwareAddr) error
	SetReadDeadline(t time.Time) error
	Close() error
}

var _ Conn = (*arp.Client)(nil)

// Neighbours edits the host's neighbour table. *netlink.Handle satisfies it.
type Neighbours interface {
	NeighSet(neigh *netlink.Neigh) error
	NeighDel(neigh *netlink.Neigh) error
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
}

var _ Neighbours = (*netlink.Handle)(nil)

// LinkWatcher tells when a link comes (back) up.
type LinkWatcher interface {
	// WatchUp sends the link's index on the returned channel each time the
	// link with the given name goes from down (or absent) to up, until ctx
	// is done; then the channel is closed. A link deleted and created again
	// under the name comes up with a new index. Sends may be coalesced.
	WatchUp(ctx context.Context, name string) (<-chan int, error)
}

// Reopen finds the bridge by name again after it was re-created and opens
// a new ARP connection on it.
type Reopen func(name string) (*net.Interface, Conn, error)

// ErrNotRunning is returned by Probe when Run is not reading from the bridge.
var ErrNotRunning = errors.New("announcer is not running")

// Defaults for Options.
const (
	DefaultCount        = 3
	DefaultInterval     = 1100 * time.Millisecond
	DefaultRefresh      = 60 * time.Second
	DefaultProbeTimeout = 150 * time.Millisecond
)

// Options tune an Announcer. Zero values take the defaults.
type Options struct {
	// Count is how many rounds of gratuitous ARP (one request and one reply
	// each) announce a new or moved VIP, and re-announce after the link
	// comes back. Default 3.
	Count int
	// Interval separates those rounds. Default 1.1 s.
	Interval time.Duration
	// Refresh is the period of the slow re-announcement of every VIP (one round
	// each) and of the re-installation of the host neighbour entries. Default
	// 60 s; negative disables it.
	Refresh time.Duration
	// ProbeTimeout is how long Probe waits for an answer. Default 150 ms.
	ProbeTimeout time.Duration
	// Links reports the bridge coming back up. New defaults to rtnetlink in the
	// network namespace New was called in; NewWithConn defaults to no watching.
	Links LinkWatcher
	// Reopen rebinds to a bridge re-created under the same name. New
	// defaults to reopening in the namespace New was called in; with
	// NewWithConn a new index only re-announces.
	Reopen Reopen
}

func (o Options) withDefaults() Options {
	if o.Count <= 0 {
		o.Count = DefaultCount
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	return o
}

// Stats counts what an Announcer has written to the bridge.
type Stats struct {
	// Gratuitous is the number of gratuitous ARP frames written; a round is
	// two frames (request form and reply form).
	Gratuitous uint64
	// Replies is the number of answers to ARP requests for owned VIPs.
	Replies uint64
	// Probes is the number of ARP probes written by Probe.
	Probes uint64
	// WriteErrors is the number of frames that could not be written.
	WriteErrors uint64
}

// entry is one owned VIP. mac is immutable once published; left, next and
// cause are touched only by the announce loop (under mu read-locked), so a
// changed MAC always gets a fresh entry.
type entry struct {
	mac  net.HardwareAddr
	left int       // gratuitous rounds still to send
	next time.Time // when the next round is due
	// cause is when the event that moved the VIP here happened (see
	// SetAfter); zero once its failover latency is observed, or if none.
	cause time.Time
}

// Announcer answers ARP for owned VIPs on one bridge. Its methods are safe for
// concurrent use.
type Announcer struct {
	name  string // bridge name: found again by it when re-created
	neigh Neighbours
	opts  Options
	// release frees what New acquired beyond the conn.
	release func()

	// linkMu guards the bridge's current incarnation: index, MAC and the
	// connection bound to it, all replaced when the bridge is re-created.
	linkMu sync.RWMutex
	index  int
	mac    net.HardwareAddr
	conn   Conn

	// active: this process is the host's announcer for the bridge and
	// answers and announces; otherwise it only reads (for Probe).
	active atomic.Bool
	// heldMu orders flipping active with the reader's look at it; held
	// are the requests read while inactive in the last heldFor.
	heldMu sync.Mutex
	held   []heldRequest

	// opMu orders Set, Remove and neighbour-table writes, so the table always
	// ends up matching the last call for each VIP.
	opMu    sync.Mutex
	neighOK map[netip.Addr]bool // guarded by opMu

	// mu guards vips. Frames for a VIP are written with mu read-locked after
	// checking the VIP is still owned, so nothing is sent for it once Remove
	// (which write-locks) returns.
	mu   sync.RWMutex
	vips map[netip.Addr]*entry

	kick chan struct{} // wakes the announce loop

	probeMu sync.Mutex
	probes  map[netip.Addr]map[*prober]struct{}

	ran        atomic.Bool
	started    chan struct{} // closed when Run starts reading
	readerDone chan struct{} // closed when the reader stops

	gratuitous, replies, probesSent, writeErrors atomic.Uint64
}

// New opens a raw ARP socket on the bridge ifi in the calling thread's network
// namespace (the socket stays there) and returns an Announcer using it. ifi
// must have an IPv4 address and a MAC. neighbours must edit the neighbour table
// of the same namespace, e.g. a *netlink.Handle from netlink.NewHandleAt.
// Close releases the socket.
func New(ifi *net.Interface, neighbours Neighbours, opts Options) (*Announcer, error) {
	pc, err := listen(ifi)
	if err != nil {
		return nil, fmt.Errorf("opening ARP socket on %s: %w", ifi.Name, err)
	}
	c, err := arp.New(ifi, pc)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("ARP client on %s (needs an IPv4 address): %w", ifi.Name, err)
	}
	var release func()
	if opts.Links == nil || opts.Reopen == nil {
		ns, err := netns.Get()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("getting the network namespace of %s: %w", ifi.Name, err)
		}
		if opts.Links == nil {
			opts.Links = NetlinkLinks{Namespace: &ns}
		}
		if opts.Reopen == nil {
			opts.Reopen = reopenIn(ns)
		}
		release = func() { ns.Close() }
	}
	a, err := NewWithConn(ifi, c, neighbours, opts)
	if err != nil {
		c.Close()
		if release != nil {
			release()
		}
		return nil, err
	}
	a.release = release
	return a, nil
}

// NewWithConn returns an Announcer for the bridge ifi that reads and writes ARP
// through conn and edits the host neighbour table through neighbours. Only
// ifi's Index, Name and HardwareAddr are used.
func NewWithConn(ifi *net.Interface, conn Conn, neighbours Neighbours, opts Options) (*Announcer, error) {
	if ifi == nil || conn == nil || neighbours == nil {
		return nil, errors.New("announce: interface, conn and neighbours are required")
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("announce: interface %s has no Ethernet address", ifi.Name)
	}
	a := &Announcer{
		index:      ifi.Index,
		name:       ifi.Name,
		mac:        bytes.Clone(ifi.HardwareAddr),
		conn:       conn,
		neigh:      neighbours,
		opts:       opts.withDefaults(),
		neighOK:    make(map[netip.Addr]bool),
		vips:       make(map[netip.Addr]*entry),
		kick:       make(chan struct{}, 1),
		probes:     make(map[netip.Addr]map[*prober]struct{}),
		started:    make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	a.active.Store(true)
	return a, nil
}

// link returns the bridge's current index, MAC and connection.
func (a *Announcer) link() (int, net.HardwareAddr, Conn) {
	a.linkMu.RLock()
	defer a.linkMu.RUnlock()
	return a.index, a.mac, a.conn
}

// Close releases the socket. Call it after Run has returned.
func (a *Announcer) Close() error {
	_, _, conn := a.link()
	err := conn.Close()
	if a.release != nil {
		a.release()
	}
	return err
}

// Stats returns the counters so far.
func (a *Announcer) Stats() Stats {
	return Stats{
		Gratuitous:  a.gratuitous.Load(),
		Replies:     a.replies.Load(),
		Probes:      a.probesSent.Load(),
		WriteErrors: a.writeErrors.Load(),
	}
}

// Owned returns the MAC that answers for vip, if vip is owned.
func (a *Announcer) Owned(vip netip.Addr) (net.HardwareAddr, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	e, ok := a.vips[vip.Unmap()]
	if !ok {
		return nil, false
	}
	return bytes.Clone(e.mac), true
}

// Set makes mac (the chosen node's NIC) answer for vip from now on. A new VIP
// or a changed MAC is announced with gratuitous ARP by Run, starting at once,
// without blocking the caller; setting the same vip and mac again does nothing.
// The host neighbour entry (vip lladdr mac dev bridge nud permanent) is
// installed before Set returns; if that fails the VIP is still answered, the
// error is returned, and the entry is retried by the next Set and by the
// periodic refresh.
func (a *Announcer) Set(vip netip.Addr, mac net.HardwareAddr) error {
	return a.SetAfter(vip, mac, time.Time{})
}

// SetAfter is Set for a VIP that moves to mac because of an event at cause
// (a libvirt lifecycle event of the domain that answered before): the time
// from cause to the first gratuitous ARP frame sent for the move is
// observed in labcloud_lb_failover_seconds. A zero cause observes nothing.
func (a *Announcer) SetAfter(vip netip.Addr, mac net.HardwareAddr, cause time.Time) error {
	vip = vip.Unmap()
	if err := validVIP(vip); err != nil {
		return err
	}
	if len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make(net.HardwareAddr, 6)) {
		return fmt.Errorf("announce: %q is not a unicast Ethernet address", mac)
	}
	mac = bytes.Clone(mac)

	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	old, ok := a.vips[vip]
	same := ok && bytes.Equal(old.mac, mac)
	if !same {
		a.vips[vip] = &entry{mac: mac, left: a.opts.Count, cause: cause}
	}
	a.mu.Unlock()
	if same && a.neighOK[vip] {
		return nil
	}
	if !same {
		a.wake()
	}
	if err := a.neigh.NeighSet(a.neighbour(vip, mac)); err != nil {
		a.neighOK[vip] = false
		return fmt.Errorf("installing neighbour %s lladdr %s on %s: %w", vip, mac, a.name, err)
	}
	a.neighOK[vip] = true
	return nil
}

// Remove stops answering for vip and deletes its host neighbour entry. Once it
// returns, no frame about vip is written.
func (a *Announcer) Remove(vip netip.Addr) error {
	vip = vip.Unmap()
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	delete(a.vips, vip)
	a.mu.Unlock()
	delete(a.neighOK, vip)
	if !vip.Is4() {
		return nil
	}
	// Delete even if this process never set it: a previous run may have.
	err := a.neigh.NeighDel(a.neighbour(vip, nil))
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("deleting neighbour %s on %s: %w", vip, a.name, err)
	}
	return nil
}

// syncNeighbours re-installs every owned VIP's neighbour entry (the kernel
// flushes them, permanent ones too, when the bridge goes down). It returns the
// first error and how many failed.
func (a *Announcer) syncNeighbours() (int, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.RLock()
	want := make(map[netip.Addr]net.HardwareAddr, len(a.vips))
	for vip, e := range a.vips {
		want[vip] = e.mac
	}
	a.mu.RUnlock()
	var first error
	failed := 0
	for vip, mac := range want {
		if err := a.neigh.NeighSet(a.neighbour(vip, mac)); err != nil {
			a.neighOK[vip] = false
			failed++
			if first == nil {
				first = fmt.Errorf("installing neighbour %s lladdr %s on %s: %w", vip, mac, a.name, err)
			}
			continue
		}
		a.neighOK[vip] = true
	}
	return failed, first
}

func (a *Announcer) neighbour(vip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	index, _, _ := a.link()
	return &netlink.Neigh{
		LinkIndex:    index,
		Family:       netlink.FAMILY_V4,
		State:        netlink.NUD_PERMANENT,
		IP:           net.IP(vip.AsSlice()),
		HardwareAddr: mac,
	}
}

func (a *Announcer) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func validVIP(vip netip.Addr) error {
	if !vip.Is4() || vip.IsUnspecified() || vip.IsLoopback() || vip.IsMulticast() ||
		vip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("announce: %s is not a unicast IPv4 address", vip)
	}
	return nil
}

// Requests read while inactive are kept this long (and at most maxHeld of
// them) for SetActive to answer: a client's request that reached the
// bridge while no process answered (a leader's process dying, names being
// handed over) still gets its answer, well within the client's wait for it
// (Linux retransmits after 1 s).
const (
	heldFor = time.Second
	maxHeld = 256
)

type heldRequest struct {
	p   *arp.Packet
	eth *ethernet.Frame
	at  time.Time
}

// SetActive says whether this Announcer answers and announces on the
// bridge: only the host's one announcer may (see Role). While inactive it
// reads the bridge (Probe works) but writes nothing; gratuitous rounds due
// meanwhile are sent once it is active, and requests for owned VIPs read
// in the last heldFor are answered at once, so that none goes unanswered
// across a hand-over. Call it after setting the VIPs to answer for.
func (a *Announcer) SetActive(on bool) {
	a.heldMu.Lock()
	was := a.active.Swap(on)
	held := a.held
	a.held = nil
	a.heldMu.Unlock()
	if was == on || !on {
		return
	}
	a.wake()
	now := time.Now()
	for _, h := range held {
		if now.Sub(h.at) < heldFor {
			a.answer(context.Background(), h.p, h.eth)
		}
	}
}

// Answering returns every owned VIP and the MAC that answers for it.
func (a *Announcer) Answering() map[netip.Addr]net.HardwareAddr {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make(map[netip.Addr]net.HardwareAddr, len(a.vips))
	for vip, e := range a.vips {
		out[vip] = bytes.Clone(e.mac)
	}
	return out
}

// Adopt makes the owned VIPs exactly want, as answers only: no gratuitous
// ARP and no neighbour-table writes, since want comes from the host's own
// record of what was announced (see Recorded). A VIP whose MAC is unchanged
// keeps its state.
func (a *Announcer) Adopt(want map[netip.Addr]net.HardwareAddr) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	for vip, e := range a.vips {
		if mac, ok := want[vip]; !ok || !bytes.Equal(mac, e.mac) {
			delete(a.vips, vip)
			delete(a.neighOK, vip)
		}
	}
	for vip, mac := range want {
		if _, ok := a.vips[vip]; !ok && validVIP(vip) == nil && len(mac) == 6 {
			a.vips[vip] = &entry{mac: bytes.Clone(mac)}
			a.neighOK[vip] = true
		}
	}
}

// Recorded reads the host's permanent IPv4 neighbour entries on the bridge:
// the durable record, kept by the kernel across a restart of this process,
// of what the last announcer installed (VIP → MAC of the answering node).
func (a *Announcer) Recorded() (map[netip.Addr]net.HardwareAddr, error) {
	index, _, _ := a.link()
	list, err := a.neigh.NeighList(index, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing neighbours on %s: %w", a.name, err)
	}
	out := map[netip.Addr]net.HardwareAddr{}
	for _, n := range list {
		if n.State&netlink.NUD_PERMANENT == 0 || len(n.HardwareAddr) != 6 {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok {
			out[ip.Unmap()] = bytes.Clone(n.HardwareAddr)
		}
	}
	return out, nil
}
