package libvirtcloud

import (
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

// libvirtCalls is how many libvirt calls labcloud_libvirt_call_duration_seconds
// has observed, in all or (with call) of one kind.
func libvirtCalls(t *testing.T, call string) uint64 {
	t.Helper()
	var labels map[string]string
	if call != "" {
		labels = map[string]string{"call": call}
	}
	h, err := testutil.GetHistogramVecFromGatherer(legacyregistry.DefaultGatherer, "labcloud_libvirt_call_duration_seconds", labels)
	if err != nil {
		return 0 // no call observed yet
	}
	return h.GetAggregatedSampleCount()
}

// TestCacheMetrics: every libvirt call is timed under its name, and the
// cache's size is published per zone, through events too.
func TestCacheMetrics(t *testing.T) {
	metrics.Register()
	all, lists := libvirtCalls(t, ""), libvirtCalls(t, "GetAllDomainStats")
	h := openFixture(t, Options{Zone: "metrics-zone"})
	if got := libvirtCalls(t, "") - all; got != h.Calls() {
		t.Errorf("%d calls timed, %d made", got, h.Calls())
	}
	if got := libvirtCalls(t, "GetAllDomainStats") - lists; got != 1 {
		t.Errorf("%d GetAllDomainStats calls timed, want 1", got)
	}
	cached := func() float64 {
		t.Helper()
		v, err := testutil.GetGaugeMetricValue(metrics.LibvirtDomains.WithLabelValues("metrics-zone"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := cached(); got != float64(len(h.Domains())) || got != 6 {
		t.Errorf("cached domains %v, want 6", got)
	}
	// A lookup the cache cannot answer asks libvirt, and is timed.
	byName := libvirtCalls(t, "LookupDomainByName")
	if _, err := h.DomainByName("no-such-domain"); err == nil {
		t.Fatal("found a domain that does not exist")
	}
	if got := libvirtCalls(t, "LookupDomainByName") - byName; got != 1 {
		t.Errorf("%d LookupDomainByName calls timed, want 1", got)
	}
}
