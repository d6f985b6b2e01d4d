package announce

import (
	"net/netip"
	"testing"
	"time"
)

// TestScheduleFollowsTable: a new or moved VIP starts its choice's rounds,
// a repeat (the same choice) keeps its place, a removed VIP is dropped, and
// rearm tops every VIP up, adopted ones too.
func TestScheduleFollowsTable(t *testing.T) {
	set := &choice{mac: node1MAC, rounds: 3, cause: time.Unix(1, 0)}
	adopted := &choice{mac: node2MAC}
	s := newSchedule()
	s.follow(&vipTable{vip: set, otherIP: adopted})
	s.slots[vip].left, s.slots[vip].next = 1, time.Unix(2, 0)

	for _, tc := range []struct {
		name  string
		table vipTable
		want  map[netip.Addr]int // rounds left
	}{
		{"repeat keeps its place", vipTable{vip: set, otherIP: adopted}, map[netip.Addr]int{vip: 1, otherIP: 0}},
		{"move starts over", vipTable{vip: {mac: node2MAC, rounds: 3}, otherIP: adopted}, map[netip.Addr]int{vip: 3, otherIP: 0}},
		{"remove drops it", vipTable{otherIP: adopted}, map[netip.Addr]int{otherIP: 0}},
		{"set again after remove starts over", vipTable{vip: set, otherIP: adopted}, map[netip.Addr]int{vip: 3, otherIP: 0}},
	} {
		s.follow(&tc.table)
		if len(s.slots) != len(tc.want) {
			t.Fatalf("%s: %d VIPs scheduled, want %d", tc.name, len(s.slots), len(tc.want))
		}
		for ip, left := range tc.want {
			if got := s.slots[ip]; got == nil || got.left != left || got.choice != tc.table[ip] {
				t.Fatalf("%s: %s has %+v, want %d rounds of its table's choice", tc.name, ip, got, left)
			}
		}
	}
	if s.slots[vip].cause != set.cause {
		t.Errorf("cause %v, want the choice's %v", s.slots[vip].cause, set.cause)
	}

	s.slots[vip].left, s.slots[vip].next = 2, time.Unix(3, 0)
	s.rearm(s.seen, 1)
	if r := s.slots[vip]; r.left != 2 || r.next.IsZero() {
		t.Errorf("rearm(1) changed a VIP with 2 rounds left: %+v", r)
	}
	if r := s.slots[otherIP]; r.left != 1 || !r.next.IsZero() {
		t.Errorf("rearm(1) of an adopted VIP: %+v, want 1 round due now", r)
	}
}
