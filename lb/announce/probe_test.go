package announce

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

// The guest whose liveness is probed: not a VIP, at its own MAC.
var (
	guestIP  = otherIP
	guestIP6 = otherIP6
	guestMAC = node2MAC
)

// probeThen runs probe while, once the announcer's first probe is on the
// segment, the station writes what answer writes; it returns probe's
// result.
func probeThen[T any](t *testing.T, f *fixture, v6 bool, answer func(), probe func() T) T {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if v6 {
			if _, _, ok := f.st.readND(wait); !ok {
				t.Error("no duplicate-address probe")
				return
			}
		} else if _, _, err := f.st.read(wait); err != nil {
			t.Errorf("no ARP probe: %v", err)
			return
		}
		answer()
	}()
	got := probe()
	<-done
	f.st.drain()
	f.st.drainND()
	return got
}

// TestProbeForTheGuestsOwnMAC: liveness waits for the guest's own MAC.
// A frame naming the guest's MAC from another Ethernet source (a LAN host
// keeping a dead guest "alive") neither counts nor ends the wait; another
// host's answer (a LAN host making a live guest look lost) does not end
// the wait either, so the guest's own answer after it counts. Both, over
// ARP and over neighbour discovery.
func TestProbeForTheGuestsOwnMAC(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, testOptions())
	f.run()
	probeFor := func(ip netip.Addr) func() bool {
		return func() bool {
			ok, err := f.a.ProbeFor(ctx, ip, guestMAC)
			if err != nil {
				t.Fatalf("ProbeFor(%s, %s): %v", ip, guestMAC, err)
			}
			return ok
		}
	}
	reply := func(mac net.HardwareAddr) *arp.Packet {
		return arpPacket(arp.OperationReply, mac, guestIP, bridgeMAC, netip.IPv4Unspecified())
	}
	na := func(ethSrc, lla net.HardwareAddr) []byte {
		var opts []ndp.Option
		if lla != nil {
			opts = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: lla}}
		}
		return mustND(t, &ndp.NeighborAdvertisement{Override: true, TargetAddress: guestIP6, Options: opts},
			ethSrc, guestIP6, allNodesMAC, allNodes)
	}

	for _, tc := range []struct {
		name   string
		v6     bool
		answer func()
		want   bool
	}{
		{"forged ARP reply", false, func() { f.st.sendFrame(reply(guestMAC), rogueMAC, bridgeMAC) }, false},
		{"another host's ARP reply, then the guest's", false, func() {
			f.st.send(reply(rogueMAC), bridgeMAC)
			f.st.send(reply(guestMAC), bridgeMAC)
		}, true},
		{"forged advertisement", true, func() { f.st.sendND(na(rogueMAC, guestMAC)) }, false},
		{"another host's advertisement, then the guest's", true, func() {
			f.st.sendND(na(rogueMAC, rogueMAC))
			f.st.sendND(na(guestMAC, nil)) // without the option: its Ethernet source
		}, true},
	} {
		ip := guestIP
		if tc.v6 {
			ip = guestIP6
		}
		if got := probeThen(t, f, tc.v6, tc.answer, probeFor(ip)); got != tc.want {
			t.Errorf("%s: ProbeFor(%s, %s) = %v, want %v", tc.name, ip, guestMAC, got, tc.want)
		}
	}
	if s := f.a.Stats(); s.Forged != 2 {
		t.Errorf("Forged = %d, want the 2 forged frames", s.Forged)
	}
	if _, err := f.a.ProbeFor(ctx, guestIP, nil); err == nil {
		t.Error("ProbeFor with no MAC to wait for: no error")
	}
}

// TestProbeIgnoresForgedAnswers: a frame whose Ethernet source is not the
// MAC it names is no host's answer: the probe before a claim finds the
// address free; a sincere answer from that MAC is a conflict.
func TestProbeIgnoresForgedAnswers(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, testOptions())
	f.run()
	probe := func() net.HardwareAddr {
		owner, taken, err := f.a.Probe(ctx, otherIP)
		if err != nil || taken != (owner != nil) {
			t.Fatalf("Probe(%s) = %s, %v, %v", otherIP, owner, taken, err)
		}
		return owner
	}
	claim := arpPacket(arp.OperationReply, rogueMAC, otherIP, bridgeMAC, netip.IPv4Unspecified())
	if owner := probeThen(t, f, false, func() { f.st.sendFrame(claim, clientMAC, bridgeMAC) }, probe); owner != nil {
		t.Errorf("a forged answer made %s the owner", owner)
	}
	if owner := probeThen(t, f, false, func() { f.st.sendFrame(claim, rogueMAC, bridgeMAC) }, probe); !bytes.Equal(owner, rogueMAC) {
		t.Errorf("owner %s, want %s", owner, rogueMAC)
	}
}
