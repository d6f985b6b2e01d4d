package chaos

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab"
)

// TestLANClientReachesTheBridge plugs the LAN client into a bridge named as
// the lab's, in a namespace of the test's, and asks for the bridge's own
// address: the kernel's answer must come back through the veth.
func TestLANClientReachesTheBridge(t *testing.T) {
	// The test's namespace stands in for the lab's.
	nstest.InNew(t, func(netns.NsHandle) { lanClientReachesTheBridge(t) })
}

func lanClientReachesTheBridge(t *testing.T) {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: lab.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(lab.Addressing{}.Gateway() + "/24")
	if err := netlink.AddrAdd(br, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	lan, err := lanClient(lab.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := lan.Capture()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	gw := netip.MustParseAddr(lab.Addressing{}.Gateway())
	var got map[netip.Addr][]string
	for i := 0; i < 10 && len(got[gw]) == 0; i++ { // the veth may take a moment to forward
		if got, err = p.Probe(context.Background(), []netip.Addr{gw}, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	link, _ := netlink.LinkByName(lab.Bridge)
	if want := []string{link.Attrs().HardwareAddr.String()}; !slices.Equal(got[gw], want) {
		t.Errorf("%s answered by %v, want the bridge's %v", gw, got[gw], want)
	}
	lan.Close()
	if _, err := netlink.LinkByName(chaosPort); err == nil {
		t.Errorf("%s left behind by Close", chaosPort)
	}
}
