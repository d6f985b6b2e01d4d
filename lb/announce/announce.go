// Package announce makes one node answer for each load-balancer VIP on a bridge.
//
// The CCM runs on the host, attached to the bridge. For every VIP it owns it
// answers the questions that arrive on the bridge (ARP requests for IPv4,
// Neighbor Solicitations for IPv6) with the MAC of the node chosen to serve
// that VIP, tells the segment when the choice is made or changes (gratuitous
// ARP, unsolicited Neighbor Advertisements; also at start-up, when the
// bridge's link comes back, and on a slow timer), and installs a permanent
// host neighbour entry so the host itself reaches the VIP through that node.
// Addresses that are not currently owned VIPs are never answered.
//
// Frames are written with the chosen node's MAC as the Ethernet source, so
// switches behind the bridge learn the node's MAC on the right port.
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
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
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

// NDConn carries whole Ethernet frames for IPv6 neighbour discovery: a
// packet socket on the bridge that reads Neighbor Solicitations and
// Advertisements, and writes Advertisements and probes.
type NDConn interface {
	net.PacketConn
	// SetPromiscuous makes the bridge hand up frames addressed to other
	// MACs too: a client re-checking a VIP sends its solicitation to the
	// answering node's MAC, which the bridge would otherwise only forward.
	SetPromiscuous(on bool) error
}

var _ NDConn = (*packet.Conn)(nil)

// Groups joins and leaves IPv6 multicast groups on the bridge, so that
// multicast snooping (the bridge's own, and switches behind it) delivers
// the solicitations for owned VIPs to the host.
type Groups interface {
	Join(group netip.Addr) error
	Leave(group netip.Addr) error
	Close() error
}

// Conns are the sockets an Announcer uses on one incarnation of the bridge.
type Conns struct {
	ARP Conn
	ND  NDConn
	// Groups may be nil: solicitations then reach the host only where
	// nothing snoops multicast.
	Groups Groups
}

func (c Conns) close() error {
	errs := []error{c.ARP.Close(), c.ND.Close()}
	if c.Groups != nil {
		errs = append(errs, c.Groups.Close())
	}
	return errors.Join(errs...)
}

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
// new connections on it.
type Reopen func(name string) (*net.Interface, Conns, error)

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
	// OnDefend, if set, is told when another host's claim on a VIP this
	// Announcer answers is answered in the VIP's defence: at most once
	// per DefendInterval per VIP (see defend.go). It must not block.
	OnDefend func(Defence)
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

// Announcer answers ARP and NDP for owned VIPs on one bridge. Its methods are safe for
// concurrent use.
//
// The VIP table is written only under changeMu (by Set, Remove and Adopt),
// which also orders the neighbour-table writes; each change publishes a new
// table and none is edited once published, so readers take no lock. The
// announce loop alone owns the round schedule (a local of the loop) and
// replaces the bridge's incarnation when the bridge is re-created.
type Announcer struct {
	name  string // bridge name: found again by it when re-created
	neigh Neighbours
	opts  Options
	// release frees what New acquired beyond the conns.
	release func()

	bridge atomic.Pointer[incarnation] // replaced only by rebind

	vips atomic.Pointer[vipTable] // see table.go
	// changeMu orders Set, Remove, Adopt and neighbour-table writes, so the
	// neighbour table always ends up matching the last call for each VIP.
	changeMu sync.Mutex
	neighOK  map[netip.Addr]bool // guarded by changeMu
	joined   joinedGroups        // guarded by changeMu; see groups.go
	// wireMu is held for reading while a frame about a VIP is written, and
	// for writing while a new table is published: once Set or Remove
	// returns, nothing is sent from the table it replaced.
	wireMu sync.RWMutex
	// answerMACs are the MACs the published table answers with, so that
	// telling our own frames from a stranger's claim costs a lookup, not
	// a walk of the table per frame. Guarded by wireMu; set with the table.
	answerMACs map[string]bool

	kick chan struct{} // wakes the announce loop

	handover handover // answering or standing by; see handover.go
	probes   probers  // Probes waiting for an answer

	ran        atomic.Bool
	started    chan struct{} // closed when Run starts reading
	readerDone chan struct{} // closed when the readers stop

	stats counters
}

// incarnation is the bridge as it is now: index, MAC and the connections
// bound to it. A bridge re-created under its name is a new incarnation.
type incarnation struct {
	index int
	mac   net.HardwareAddr
	Conns
}

// New opens raw ARP and neighbour-discovery sockets on the bridge ifi in the
// calling thread's network namespace (they stay there) and returns an
// Announcer using them. ifi needs a MAC, and no address of either family.
// neighbours must edit the neighbour table of the same namespace, e.g. a
// *netlink.Handle from netlink.NewHandleAt. Close releases the sockets.
func New(ifi *net.Interface, neighbours Neighbours, opts Options) (*Announcer, error) {
	c, err := open(ifi)
	if err != nil {
		return nil, err
	}
	var release func()
	if opts.Links == nil || opts.Reopen == nil {
		ns, err := netns.Get()
		if err != nil {
			c.close()
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
	a, err := NewWithConns(ifi, c, neighbours, opts)
	if err != nil {
		c.close()
		if release != nil {
			release()
		}
		return nil, err
	}
	a.release = release
	return a, nil
}

// NewWithConns returns an Announcer for the bridge ifi that reads and writes
// frames through conns and edits the host neighbour table through
// neighbours. Only ifi's Index, Name and HardwareAddr are used.
func NewWithConns(ifi *net.Interface, conns Conns, neighbours Neighbours, opts Options) (*Announcer, error) {
	if ifi == nil || conns.ARP == nil || conns.ND == nil || neighbours == nil {
		return nil, errors.New("announce: interface, ARP and ND conns and neighbours are required")
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("announce: interface %s has no Ethernet address", ifi.Name)
	}
	a := &Announcer{
		name:       ifi.Name,
		neigh:      neighbours,
		opts:       opts.withDefaults(),
		neighOK:    make(map[netip.Addr]bool),
		kick:       make(chan struct{}, 1),
		handover:   handover{on: true},
		probes:     probers{byVIP: make(map[netip.Addr]map[*prober]struct{})},
		started:    make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	a.bridge.Store(&incarnation{index: ifi.Index, mac: bytes.Clone(ifi.HardwareAddr), Conns: conns})
	a.vips.Store(&vipTable{})
	return a, nil
}

// Close releases the sockets. Call it after Run has returned.
func (a *Announcer) Close() error {
	err := a.bridge.Load().close()
	if a.release != nil {
		a.release()
	}
	return err
}

// wake tells the announce loop that the table or the hand-over changed.
func (a *Announcer) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}
