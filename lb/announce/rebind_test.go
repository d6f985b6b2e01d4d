package announce

import (
	"bytes"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
)

// recreateBridge deletes br-lab and creates it again under the same name
// (so with a new interface index), as `virsh net-destroy` + `net-start` or
// a netplan re-apply do, re-attaches the ports and returns when it carries
// traffic again.
func (l *lab) recreateBridge() time.Time {
	l.tb.Helper()
	h := l.host.h
	l.check(h.LinkDel(l.bridge), "deleting the bridge")
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab", HardwareAddr: labBridgeMAC}}
	l.check(h.LinkAdd(br), "adding the bridge again")
	bridge, err := h.LinkByName("br-lab")
	l.check(err, "bridge")
	if bridge.Attrs().Index == l.bridge.Attrs().Index {
		l.tb.Fatalf("the new bridge got the old index %d", bridge.Attrs().Index)
	}
	l.bridge = bridge
	l.check(h.AddrAdd(bridge, &netlink.Addr{IPNet: prefix("10.77.0.1/24")}), "bridge address")
	for _, port := range []string{"p-node1", "p-node2", "p-client", "p-rogue"} {
		link, err := h.LinkByName(port)
		l.check(err, port)
		l.check(h.LinkSetMaster(link, bridge), "enslaving "+port)
	}
	l.check(h.LinkSetUp(bridge), "bridge up")
	if _, ok := waitFor(5*time.Second, func() bool {
		link, err := h.LinkByIndex(bridge.Attrs().Index)
		return err == nil && link.Attrs().OperState == netlink.OperUp
	}); !ok {
		l.tb.Fatal("the new bridge does not come up")
	}
	return time.Now()
}

// TestNetnsBridgeRecreated: after the bridge is deleted and created again,
// the announcer finds it by name: answers, the host neighbour entry and
// gratuitous ARP are back within a second, without a restart.
func TestNetnsBridgeRecreated(t *testing.T) {
	l := newLab(t, labOptions())
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	if _, ok := waitFor(3*time.Second, func() bool { return l.a.Stats().Gratuitous >= 6 }); !ok {
		t.Fatalf("initial burst: %d frames", l.a.Stats().Gratuitous)
	}
	sniff := l.sniff(l.client)
	back := l.recreateBridge()

	if _, ok := sniff.await(labVIP, labNodeMAC[0], arp.OperationRequest, time.Second); !ok {
		t.Error("no gratuitous ARP within 1 s of the bridge coming back")
	}
	if d, ok := waitFor(time.Second, func() bool {
		n, ok := neighbour(t, l.host, "br-lab", labVIP)
		return ok && bytes.Equal(n.HardwareAddr, labNodeMAC[0])
	}); !ok {
		t.Error("host neighbour entry not re-installed on the new bridge within 1 s")
	} else {
		t.Logf("neighbour entry back %v after the bridge", d.Round(time.Millisecond))
	}
	client := l.arpClient(l.client)
	p, _ := ask(t, client, labVIP, time.Second)
	if p == nil || !bytes.Equal(p.SenderHardwareAddr, labNodeMAC[0]) {
		t.Fatalf("after the re-creation, answer %+v, want %s", p, labNodeMAC[0])
	}
	t.Logf("answered %v after the bridge was back", time.Since(back).Round(time.Millisecond))
}
