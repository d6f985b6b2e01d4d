package lb

import (
	"bytes"
	"net"
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAnnouncedConditionRoundTrip(t *testing.T) {
	mac1, mac2 := net.HardwareAddr{0x52, 0x54, 0, 0x7c, 0, 1}, net.HardwareAddr{0x52, 0x54, 0, 0x7c, 0, 2}
	v4, v6 := netip.MustParseAddr("10.123.0.200"), netip.MustParseAddr("fd00::200")
	for _, tc := range []struct {
		name    string
		answers []Answer
		status  metav1.ConditionStatus
		reason  string
		message string
	}{
		{"answered", []Answer{{v4, "lab-node-1", mac1}}, metav1.ConditionTrue, ReasonAnnounced,
			"10.123.0.200 answered by node lab-node-1 (52:54:00:7c:00:01)"},
		{"nobody", []Answer{{VIP: v4}}, metav1.ConditionFalse, ReasonNoEligibleNode,
			"10.123.0.200 answered by no node (none is eligible: it needs a running domain on the bridge, a Ready Node and, with externalTrafficPolicy Local, a ready endpoint)"},
		{"unknown node", []Answer{{VIP: v4, MAC: mac2}}, metav1.ConditionTrue, ReasonAnnounced,
			"10.123.0.200 answered by an unknown node (52:54:00:7c:00:02)"},
		{"two families, one unanswered, in VIP order", []Answer{{VIP: v6}, {v4, "lab-node-2", mac2}}, metav1.ConditionFalse, ReasonNoEligibleNode,
			"10.123.0.200 answered by node lab-node-2 (52:54:00:7c:00:02); fd00::200 answered by no node (none is eligible: it needs a running domain on the bridge, a Ready Node and, with externalTrafficPolicy Local, a ready endpoint)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := AnnouncedCondition(tc.answers)
			if c.Type != ConditionAnnounced || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message {
				t.Fatalf("condition %+v, want %s %s %q", c, tc.status, tc.reason, tc.message)
			}
			got, err := ParseAnnounced(c)
			if err != nil {
				t.Fatal(err)
			}
			want := AnnouncedCondition(got) // parse, then build again: the same message
			if !SameAnnounced(c, want) {
				t.Errorf("parsed %+v, which says %q", got, want.Message)
			}
			for _, a := range tc.answers {
				found := false
				for _, g := range got {
					found = found || reflect.DeepEqual(g, a)
				}
				if !found {
					t.Errorf("parsed %+v lacks %+v", got, a)
				}
			}
		})
	}
}

func TestParseAnnouncedRejects(t *testing.T) {
	for _, c := range []metav1.Condition{
		{Type: "other", Message: "10.0.0.1 answered by node a (52:54:00:00:00:01)"},
		{Type: ConditionAnnounced, Message: ""},
		{Type: ConditionAnnounced, Message: "answered by node a (52:54:00:00:00:01)"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by node a"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by node a (not-a-mac)"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 is somewhere"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by no node; 10.0.0.2 answered by no node; 10.0.0.3 answered by no node"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by no node; 10.0.0.2 answered by node a (52:54:00:00:00:01)"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by node a (01:00:5e:00:00:01)"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by node a (00:00:00:00:00:00)"},
		{Type: ConditionAnnounced, Message: "10.0.0.1 answered by node a (00:00:5e:00:53:01:02:03)"},
		{Type: ConditionAnnounced, Message: "fe80::1%eth0 answered by node a (52:54:00:00:00:01)"},
		{Type: ConditionAnnounced, Message: "::ffff:10.0.0.1 answered by node a (52:54:00:00:00:01)"},
	} {
		if got, err := ParseAnnounced(c); err == nil {
			t.Errorf("ParseAnnounced(%q) = %+v, want an error", c.Message, got)
		}
	}
}

// FuzzParseAnnounced: whatever a condition's message says (anyone who may
// write services/status may write it), ParseAnnounced returns an error or
// one answer per family at most, in VIP order, each a VIP as labcloud
// writes them and a unicast Ethernet MAC or none, which its own message
// reads back the same.
func FuzzParseAnnounced(f *testing.F) {
	f.Add("10.123.0.200 answered by node lab-node-1 (52:54:00:7c:00:01)")
	f.Add("10.123.0.200 answered by an unknown node (52:54:00:7c:00:02); fd00::200 answered by no node (none is eligible)")
	f.Add("fd00::200 answered by node b (52:54:00:7c:00:02); 10.123.0.200 answered by no node")
	f.Add("10.0.0.1 answered by node a (00:00:5e:00:53:01:02:03)")
	f.Add("10.0.0.1 answered by node a (01:00:5e:00:00:01); 10.0.0.2 answered by no node")
	f.Add("fe80::1%eth0 answered by node a (52:54:00:00:00:01)")
	f.Fuzz(func(t *testing.T, msg string) {
		got, err := ParseAnnounced(metav1.Condition{Type: ConditionAnnounced, Message: msg})
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > maxSegments {
			t.Fatalf("%q: %d answers", msg, len(got))
		}
		for i, a := range got {
			if !a.VIP.IsValid() || a.VIP.Zone() != "" || a.VIP.Is4In6() {
				t.Fatalf("%q: VIP %s", msg, a.VIP)
			}
			if i > 0 && (got[i-1].VIP.Is4() == a.VIP.Is4() || got[i-1].VIP.Compare(a.VIP) >= 0) {
				t.Fatalf("%q: answers %+v are not one per family in VIP order", msg, got)
			}
			if a.MAC != nil && (len(a.MAC) != 6 || a.MAC[0]&1 != 0 || bytes.Equal(a.MAC, make(net.HardwareAddr, 6))) {
				t.Fatalf("%q: MAC %s is not a NIC's", msg, a.MAC)
			}
			if a.MAC == nil && a.Node != "" {
				t.Fatalf("%q: node %q without a MAC", msg, a.Node)
			}
		}
		again, err := ParseAnnounced(AnnouncedCondition(got))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("%q reads as %+v, whose own message reads as %+v, %v", msg, got, again, err)
		}
	})
}
