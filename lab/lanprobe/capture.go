package lanprobe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// A capture keeps, of answers and announcements apart, the latest
// maxFrames frames of each of the first maxAddrs addresses: a LAN may
// carry anything.
const (
	maxFrames = 4096
	maxAddrs  = 4096
)

// Capture records what reaches an interface, each frame stamped when it
// arrives: the answers to the ARP requests it sends (Request, Probe), and
// every announcement (Announcement). Close ends it.
type Capture struct {
	conn *packet.Conn
	arp  *arp.Client // sends the requests, over conn; nil without self
	self netip.Addr  // the address asking, the target of answers to it

	mu        sync.Mutex
	answers   map[netip.Addr][]Frame // by the answering address
	announced map[netip.Addr][]Frame // by the announced address
	err       error                  // what ended the capture early

	closing atomic.Bool
	done    chan struct{}
}

// Capture starts recording what reaches the client.
func (c *Client) Capture() (*Capture, error) {
	var a *Capture
	err := c.Do(func() error {
		ifi, err := net.InterfaceByName(Interface)
		if err == nil {
			a, err = Listen(ifi, c.Addr())
		}
		return err
	})
	return a, err
}

// Listen starts recording what reaches ifi, in the calling thread's
// namespace; requests ask from self, which must be ifi's IPv4 address,
// and none can be sent without one.
func Listen(ifi *net.Interface, self netip.Addr) (*Capture, error) {
	a := &Capture{self: self, answers: map[netip.Addr][]Frame{}, announced: map[netip.Addr][]Frame{}, done: make(chan struct{})}
	var err error
	// Every protocol: ARP and the IPv6 advertisements both.
	if a.conn, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil); err != nil {
		return nil, fmt.Errorf("capture on %s: %w", ifi.Name, err)
	}
	if self.IsValid() {
		if a.arp, err = arp.New(ifi, a.conn); err != nil {
			a.conn.Close()
			return nil, err
		}
	}
	go a.read()
	return a, nil
}

// read records frames until the socket is closed.
func (a *Capture) read() {
	defer close(a.done)
	buf := make([]byte, 1600)
	for {
		n, _, err := a.conn.ReadFrom(buf)
		at := time.Now()
		if err != nil {
			if !a.closing.Load() {
				a.mu.Lock()
				a.err = fmt.Errorf("capture: %w", err)
				a.mu.Unlock()
			}
			return
		}
		if f, ok := Announcement(buf[:n]); ok {
			f.At = at
			a.record(a.announced, f)
		} else if f, ok := a.answer(buf[:n]); ok {
			f.At = at
			a.record(a.answers, f)
		}
	}
}

// answer reads an ARP reply to the client.
func (a *Capture) answer(b []byte) (Frame, bool) {
	var f ethernet.Frame
	var p arp.Packet
	if f.UnmarshalBinary(b) != nil || f.EtherType != ethernet.EtherTypeARP || p.UnmarshalBinary(f.Payload) != nil ||
		p.Operation != arp.OperationReply || p.TargetIP != a.self {
		return Frame{}, false
	}
	return Frame{IP: p.SenderIP, MAC: p.SenderHardwareAddr, Op: p.Operation}, true
}

func (a *Capture) record(m map[netip.Addr][]Frame, f Frame) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := m[f.IP]; !ok && len(m) >= maxAddrs {
		return
	}
	l := append(m[f.IP], f)
	if len(l) > maxFrames {
		l = slices.Delete(l, 0, len(l)-maxFrames)
	}
	m[f.IP] = l
}

// Request asks the LAN who has ip; the answers are recorded.
func (a *Capture) Request(ip netip.Addr) error {
	if a.arp == nil {
		return errors.New("a capture without an address to ask from")
	}
	return a.arp.Request(ip)
}

// Answered is the first answer to the client for ip that arrived at or
// after since.
func (a *Capture) Answered(ip netip.Addr, since time.Time) (Frame, bool) {
	if fs := a.since(a.answers, ip, nil, since); len(fs) > 0 {
		return fs[0], true
	}
	return Frame{}, false
}

// AnswerMACs are the MACs, distinct and sorted, that answered the client
// for ip at or after since.
func (a *Capture) AnswerMACs(ip netip.Addr, since time.Time) []string {
	var out []string
	for _, f := range a.since(a.answers, ip, nil, since) {
		out = append(out, f.MAC.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Announced are the announcements of ip naming mac (any, when nil) that
// arrived at or after since, in order.
func (a *Capture) Announced(ip netip.Addr, mac net.HardwareAddr, since time.Time) []Frame {
	return a.since(a.announced, ip, mac, since)
}

func (a *Capture) since(m map[netip.Addr][]Frame, ip netip.Addr, mac net.HardwareAddr, since time.Time) []Frame {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Frame
	for _, f := range m[ip] {
		if !f.At.Before(since) && (mac == nil || f.MAC.String() == mac.String()) {
			out = append(out, f)
		}
	}
	return out
}

// Probe asks for every address and returns, for each, the MACs that
// answered within wait (AnswerMACs); those nobody answered are asked once
// more, as a client retries. It fails when the capture has.
func (a *Capture) Probe(ctx context.Context, ips []netip.Addr, wait time.Duration) (map[netip.Addr][]string, error) {
	start := time.Now()
	out := map[netip.Addr][]string{}
	for range 2 {
		var ask []netip.Addr
		for _, ip := range ips {
			if len(out[ip]) == 0 {
				ask = append(ask, ip)
			}
		}
		if len(ask) == 0 || ctx.Err() != nil {
			break
		}
		for _, ip := range ask {
			if err := a.Request(ip); err != nil {
				return nil, fmt.Errorf("ARP request for %s: %w", ip, err)
			}
		}
		time.Sleep(wait)
		for _, ip := range ask {
			if macs := a.AnswerMACs(ip, start); len(macs) > 0 {
				out[ip] = macs
			}
		}
	}
	if err := a.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// Err is what ended the capture before Close, if anything did.
func (a *Capture) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Close ends the capture.
func (a *Capture) Close() error {
	a.closing.Store(true)
	err := a.conn.Close()
	<-a.done
	return err
}
