package announce

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
)

// These benchmarks run over the injected UDP loopback segment; the netns_test.go
// ones measure the same on a real bridge.

// BenchmarkSetToFirstFrame: from Set to the first gratuitous frame read on the
// other end of the segment.
func BenchmarkSetToFirstFrame(b *testing.B) {
	opts := testOptions()
	opts.Interval = time.Hour // only the first round
	f := newFixture(b, opts)
	f.run()
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		mac := node1MAC
		if i%2 == 1 {
			mac = node2MAC
		}
		start := time.Now()
		if err := f.a.Set(vip, mac); err != nil {
			b.Fatal(err)
		}
		for {
			p, _ := f.st.next(wait)
			if p.SenderIP == vip && bytes.Equal(p.SenderHardwareAddr, mac) {
				break
			}
		}
		total += time.Since(start)
		f.st.next(wait) // the reply form of the same round
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/set-to-frame")
}

// BenchmarkAnswer: a request for an owned VIP to its answer, round trip.
func BenchmarkAnswer(b *testing.B) {
	f := newFixture(b, testOptions())
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		b.Fatal(err)
	}
	f.st.gratuitous(vip, node1MAC, 2*f.a.opts.Count, wait)
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		f.st.request(vip)
		if p, _ := f.st.next(wait); p.Operation != arp.OperationReply {
			b.Fatalf("got %v", p.Operation)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/answer")
}

// BenchmarkProbe: Probe of a free address (lasts the probe timeout) and of a
// taken one (lasts until the owner answers).
func BenchmarkProbe(b *testing.B) {
	b.Run("free", func(b *testing.B) {
		f := newFixture(b, testOptions())
		f.run()
		for b.Loop() {
			if _, taken, err := f.a.Probe(context.Background(), otherIP); err != nil || taken {
				b.Fatal(taken, err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/probe")
	})
	b.Run("taken", func(b *testing.B) {
		f := newFixture(b, testOptions())
		f.run()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { // a host owning otherIP answers every probe for it
			for ctx.Err() == nil {
				p, _, err := f.st.read(50 * time.Millisecond)
				if err != nil || p.TargetIP != otherIP {
					continue
				}
				f.st.c.WriteTo(arpPacket(arp.OperationReply, rogueMAC, otherIP, bridgeMAC, netip.IPv4Unspecified()), bridgeMAC)
			}
		}()
		for b.Loop() {
			if _, taken, err := f.a.Probe(context.Background(), otherIP); err != nil || !taken {
				b.Fatal(taken, err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/probe")
	})
}

// BenchmarkNetnsSetToWire: from Set to the first gratuitous frame captured in
// the client namespace, across a real bridge (root only).
func BenchmarkNetnsSetToWire(b *testing.B) {
	opts := labOptions()
	opts.Interval = time.Hour // only the first round
	l := newLab(b, opts)
	sniff := l.sniff(l.client)
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		mac := labNodeMAC[i%2]
		start := time.Now()
		l.check(l.a.Set(labVIP, mac), "Set")
		f, ok := sniff.await(labVIP, mac, arp.OperationRequest, 2*time.Second)
		if !ok {
			b.Fatal("no gratuitous frame on the wire")
		}
		total += f.at.Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/set-to-wire")
}

// BenchmarkNetnsAnswer: the client's ARP request for the VIP to the answer,
// across a real bridge (root only).
func BenchmarkNetnsAnswer(b *testing.B) {
	l := newLab(b, labOptions())
	client := l.arpClient(l.client)
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		if p, _ := ask(b, client, labVIP, time.Second); p == nil {
			b.Fatal("no answer")
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/answer")
}

// BenchmarkNetnsProbe: Probe latency across a real bridge, for an address a
// rogue namespace owns (until its kernel answers) and for a free one (the
// probe timeout).
func BenchmarkNetnsProbe(b *testing.B) {
	for _, tc := range []struct {
		name  string
		ip    netip.Addr
		taken bool
	}{{"taken", labRogueIP, true}, {"free", labFreeIP, false}} {
		b.Run(tc.name, func(b *testing.B) {
			l := newLab(b, labOptions())
			for b.Loop() {
				if _, taken, err := l.a.Probe(context.Background(), tc.ip); err != nil || taken != tc.taken {
					b.Fatalf("Probe(%s) = %v, %v", tc.ip, taken, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/probe")
		})
	}
}

// BenchmarkNetnsIPv6SetToClientEntry: from Set moving an IPv6 VIP to the
// client's kernel holding the new MAC, taken from the unsolicited Neighbor
// Advertisement alone, across a real bridge (root only).
func BenchmarkNetnsIPv6SetToClientEntry(b *testing.B) {
	opts := labOptions()
	opts.Interval = time.Hour // only the first round
	l := newLab(b, opts)
	l.startEchoServers()
	c := l.udpSocket(l.client, nil)
	l.check(l.a.Set(labVIP6, labNodeMAC[0]), "Set")
	reachVIP(b, c, labVIP6) // the client holds an entry to move

	updates := make(chan netlink.NeighUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	l.check(netlink.NeighSubscribeAt(l.client.ns, updates, done), "subscribing to the client's neighbours")
	var total time.Duration
	for i := 1; b.Loop(); i++ {
		mac := labNodeMAC[i%2]
		start := time.Now()
		l.check(l.a.Set(labVIP6, mac), "Set")
		timeout := time.After(2 * time.Second)
	wait:
		for {
			select {
			case u := <-updates:
				if u.IP.Equal(labVIP6.AsSlice()) && bytes.Equal(u.HardwareAddr, mac) {
					total += time.Since(start)
					break wait
				}
			case <-timeout:
				b.Fatalf("the client's entry did not move to %s", mac)
			}
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/set-to-client-entry")
}
