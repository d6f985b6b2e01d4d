package announce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// TestNetnsProbeForGuest: liveness on a real bridge, the guest's own
// kernel answering (node1 stands for a guest). A LAN host that forges
// replies naming a silent guest's MAC from its own Ethernet source does
// not keep the guest alive; one that answers the probe first with its own
// MAC does not make a live guest look lost: the guest's answer to the
// second probe counts.
func TestNetnsProbeForGuest(t *testing.T) {
	opts := labOptions()
	opts.ProbeTimeout = time.Second // room for the guest's answer to the second probe, at 500 ms
	l := newLab(t, opts)
	ctx := context.Background()
	guest := l.nodes[0]
	silent := func(on bool) error {
		ignore := "1"
		if on {
			ignore = "8" // answer no ARP request at all
		}
		return inNamespace(guest.ns, func() error { return writeSysctl("net/ipv4/conf/all/arp_ignore", ignore) })
	}
	probeFor := func() bool {
		t.Helper()
		ok, err := l.a.ProbeFor(ctx, guest.ip, guest.mac)
		l.check(err, fmt.Sprintf("ProbeFor(%s, %s)", guest.ip, guest.mac))
		return ok
	}
	reply := func(sha net.HardwareAddr) *arp.Packet {
		return arpPacket(arp.OperationReply, sha, guest.ip, labBridgeMAC, netip.IPv4Unspecified())
	}
	if !probeFor() {
		t.Fatal("a live guest did not answer: the rest proves nothing")
	}

	l.check(silent(true), "silencing the guest")
	forger := l.rawSocket(l.rogue, unix.ETH_P_ARP)
	forged := frameBytes(t, reply(guest.mac), labRogueMAC, labBridgeMAC)
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for {
			if _, err := forger.WriteTo(forged, &packet.Addr{HardwareAddr: labBridgeMAC}); err == nil {
				n++
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	alive := probeFor()
	close(stop)
	sent := <-done
	s := l.a.Stats()
	t.Logf("%d forged replies sent during the probe, %d counted as forged", sent, s.Forged)
	if alive {
		t.Error("a silent guest counted as alive on replies forged by another host")
	}
	if sent == 0 || s.Forged == 0 {
		t.Error("no forged frame sent or counted: the check proves nothing")
	}

	// The rogue answers the first probe at once, then the guest wakes up
	// and answers the second.
	rogue := l.arpClient(l.rogue)
	l.check(rogue.SetReadDeadline(time.Now().Add(opts.ProbeTimeout)), "read deadline")
	answered := make(chan error, 1)
	go func() {
		for {
			p, _, err := rogue.Read()
			if err != nil {
				answered <- fmt.Errorf("the rogue reading the probe: %w", err)
				return
			}
			if p.Operation == arp.OperationRequest && p.SenderIP.IsUnspecified() && p.TargetIP == guest.ip {
				break
			}
		}
		answered <- errors.Join(rogue.WriteTo(reply(labRogueMAC), labBridgeMAC), silent(false))
	}()
	alive = probeFor()
	l.check(<-answered, "the rogue's answer, then the guest's")
	if !alive {
		t.Error("a live guest looked lost after another host answered its probe first")
	}
}
