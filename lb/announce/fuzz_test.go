package announce

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// recordConn records what is written; it never reads anything.
type recordConn struct {
	mu     sync.Mutex
	writes []recorded
}

type recorded struct {
	p   arp.Packet
	dst net.HardwareAddr
}

func (c *recordConn) Read() (*arp.Packet, *ethernet.Frame, error) {
	return nil, nil, net.ErrClosed
}

func (c *recordConn) WriteTo(p *arp.Packet, dst net.HardwareAddr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, recorded{*p, dst})
	return nil
}

func (c *recordConn) SetReadDeadline(time.Time) error { return nil }
func (c *recordConn) Close() error                    { return nil }

// recordND records the neighbour-discovery frames written; it never reads
// anything.
type recordND struct {
	net.PacketConn // nil: only the methods below are called
	mu             sync.Mutex
	frames         [][]byte
}

func (c *recordND) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frames = append(c.frames, bytes.Clone(b))
	return len(b), nil
}

func (c *recordND) take() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.frames
	c.frames = nil
	return out
}

func (c *recordND) SetPromiscuous(bool) error { return nil }
func (c *recordND) Close() error              { return nil }

func frameBytes(tb testing.TB, p *arp.Packet, src, dst net.HardwareAddr) []byte {
	pb, err := p.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	fb, err := (&ethernet.Frame{Destination: dst, Source: src, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	return fb
}

// FuzzHandle feeds arbitrary frames to the responder: whatever arrives, it
// writes a reply for the owned VIP with the chosen MAC, to a unicast
// address, or a round of gratuitous ARP in the VIP's defence, at most once
// per DefendInterval, or nothing.
func FuzzHandle(f *testing.F) {
	f.Add(frameBytes(f, arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, vip), clientMAC, ethernet.Broadcast))
	f.Add(frameBytes(f, arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, otherIP), clientMAC, ethernet.Broadcast))
	f.Add(frameBytes(f, arpPacket(arp.OperationRequest, rogueMAC, vip, zeroMAC, vip), rogueMAC, ethernet.Broadcast))
	f.Add(frameBytes(f, arpPacket(arp.OperationReply, rogueMAC, vip, clientMAC, clientIP), rogueMAC, clientMAC))
	f.Add(frameBytes(f, arpPacket(arp.OperationRequest, rogueMAC, vip.Prev(), zeroMAC, vip), ethernet.Broadcast, ethernet.Broadcast))
	f.Add([]byte{})
	f.Add(make([]byte, 60))

	conn := &recordConn{}
	a, err := NewWithConns(&net.Interface{Index: 7, Name: "br-fuzz", HardwareAddr: bridgeMAC}, Conns{ARP: conn, ND: &recordND{}}, newFakeNeighbours(), testOptions())
	if err != nil {
		f.Fatal(err)
	}
	if err := a.Set(vip, node1MAC); err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	start, defences := time.Now(), 0
	f.Fuzz(func(t *testing.T, b []byte) {
		var eth ethernet.Frame
		if err := eth.UnmarshalBinary(b); err != nil {
			return
		}
		var p arp.Packet
		if err := p.UnmarshalBinary(eth.Payload); err != nil {
			return
		}
		conn.mu.Lock()
		conn.writes = conn.writes[:0]
		conn.mu.Unlock()

		a.handle(ctx, &p, &eth)

		conn.mu.Lock()
		defer conn.mu.Unlock()
		if defence(conn.writes) {
			defences++
			if limit := 1 + int(time.Since(start)/DefendInterval); defences > limit {
				t.Fatalf("%d defences in %v", defences, time.Since(start))
			}
			if p.SenderIP != vip || bytes.Equal(p.SenderHardwareAddr, node1MAC) || bytes.Equal(p.SenderHardwareAddr, bridgeMAC) {
				t.Fatalf("defended against %v %s is-at %s", p.Operation, p.SenderIP, p.SenderHardwareAddr)
			}
			return
		}
		if len(conn.writes) > 1 {
			t.Fatalf("%d frames written for one request", len(conn.writes))
		}
		for _, w := range conn.writes {
			if w.p.Operation != arp.OperationReply || w.p.SenderIP != vip || !bytes.Equal(w.p.SenderHardwareAddr, node1MAC) {
				t.Fatalf("wrote %v %s is-at %s", w.p.Operation, w.p.SenderIP, w.p.SenderHardwareAddr)
			}
			if len(w.dst) != 6 || w.dst[0]&1 != 0 {
				t.Fatalf("reply sent to group address %s", w.dst)
			}
			if p.TargetIP != vip || p.Operation != arp.OperationRequest || p.SenderIP == vip {
				t.Fatalf("answered %v for %s from %s", p.Operation, p.TargetIP, p.SenderIP)
			}
		}
	})
}

// defence says whether ws is one round of gratuitous ARP for vip from the
// chosen MAC, to broadcast.
func defence(ws []recorded) bool {
	if len(ws) != 2 {
		return false
	}
	for i, w := range ws {
		op := []arp.Operation{arp.OperationRequest, arp.OperationReply}[i]
		if w.p.Operation != op || w.p.SenderIP != vip || w.p.TargetIP != vip ||
			!bytes.Equal(w.p.SenderHardwareAddr, node1MAC) || !bytes.Equal(w.dst, ethernet.Broadcast) {
			return false
		}
	}
	return true
}
