package lb

import (
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
	} {
		if got, err := ParseAnnounced(c); err == nil {
			t.Errorf("ParseAnnounced(%q) = %+v, want an error", c.Message, got)
		}
	}
}
