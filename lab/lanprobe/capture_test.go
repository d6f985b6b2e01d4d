package lanprobe

import (
	"net/netip"
	"testing"
	"time"
)

// TestCaptureIsBounded: of a LAN that announces without end, a capture
// keeps the latest frames of each address and the first addresses only.
func TestCaptureIsBounded(t *testing.T) {
	a := &Capture{announced: map[netip.Addr][]Frame{}}
	t0 := time.Now()
	first := netip.MustParseAddr("10.0.0.1")
	for i := range maxFrames + 10 {
		a.record(a.announced, Frame{At: t0.Add(time.Duration(i)), IP: first})
	}
	got := a.Announced(first, nil, time.Time{})
	if len(got) != maxFrames || !got[0].At.Equal(t0.Add(10)) {
		t.Errorf("kept %d frames from %s, want the latest %d", len(got), got[0].At.Sub(t0), maxFrames)
	}
	ip := first
	for range maxAddrs + 10 {
		ip = ip.Next()
		a.record(a.announced, Frame{At: t0, IP: ip})
	}
	if len(a.announced) != maxAddrs {
		t.Errorf("%d addresses kept, want %d", len(a.announced), maxAddrs)
	}
	if got := a.Announced(first, nil, time.Time{}); len(got) != maxFrames {
		t.Errorf("an address kept from before lost its frames: %d", len(got))
	}
}
