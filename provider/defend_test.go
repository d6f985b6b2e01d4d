package provider

import (
	"net"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lb/announce"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// TestVIPDefendedEvents: each defence is told to the Service holding the
// VIP as an IPConflict Warning that names the other host and what it did.
func TestVIPDefendedEvents(t *testing.T) {
	svc := lbtest.Service("web")
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", svc).start()
	vip := f.mustEnsure(svc)
	from := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x66}
	f.lb.vipDefended(announce.Defence{VIP: vip, From: from, Probe: true})
	f.lb.vipDefended(announce.Defence{VIP: vip, From: from, Ignored: 7})
	var got []string
	for _, e := range f.Drain() {
		if strings.HasPrefix(e, v1.EventTypeWarning+" "+ReasonConflict+" ") {
			got = append(got, e)
		}
	}
	want := []string{"MAC 02:00:00:00:00:66 probed for " + vip.String(), "MAC 02:00:00:00:00:66 claims " + vip.String()}
	if len(got) != len(want) {
		t.Fatalf("events %q, want %d IPConflict Warnings", got, len(want))
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("event %q does not say %q", got[i], w)
		}
	}
}
