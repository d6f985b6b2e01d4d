package announce

import (
	"testing"
	"time"

	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

// eventually polls f (a metric read) until it returns want, for up to a
// second: metrics are updated just after the frame the station sees.
func eventually(t *testing.T, f func() (float64, error), want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		got, err := f()
		if err != nil {
			t.Fatal(err)
		}
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// failoverHistogram reads labcloud_lb_failover_seconds from the registry.
func failoverHistogram() (count, sum float64, err error) {
	h, err := testutil.GetHistogramVecFromGatherer(legacyregistry.DefaultGatherer, "labcloud_lb_failover_seconds", nil)
	if err != nil {
		return 0, 0, err
	}
	return float64(h.GetAggregatedSampleCount()), h.GetAggregatedSampleSum(), nil
}

func failovers() (float64, error) {
	n, _, err := failoverHistogram()
	return n, err
}

// TestFailoverLatencyObserved: a VIP moved by SetAfter is observed once,
// from its cause to its first gratuitous frame; Set, repeats and the later
// rounds of the burst observe nothing.
func TestFailoverLatencyObserved(t *testing.T) {
	metrics.Register()
	opts := testOptions()
	f := newFixture(t, opts)
	f.run()
	count0, sum0, err := failoverHistogram()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)

	const ago = 40 * time.Millisecond
	cause := time.Now().Add(-ago)
	if err := f.a.SetAfter(vip, node2MAC, cause); err != nil {
		t.Fatal(err)
	}
	f.st.gratuitous(vip, node2MAC, 2*opts.Count, wait)
	if got := eventually(t, failovers, count0+1); got != count0+1 {
		t.Fatalf("%v failover observations after one move, want 1", got-count0)
	}
	// The observation is made once the first frame is written, which the
	// station may read a few microseconds before the writer records it:
	// the bound is when the observation was seen.
	upper := time.Since(cause)
	_, sum, err := failoverHistogram()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Duration((sum - sum0) * float64(time.Second)); d < ago || d > upper {
		t.Errorf("observed %v; want between %v (the cause's age) and %v (when the observation was seen)", d, ago, upper)
	}

	// The same MAC again with a cause is no move.
	if err := f.a.SetAfter(vip, node2MAC, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A move without a cause (not a libvirt event) is not timed.
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.gratuitous(vip, node1MAC, 2*opts.Count, wait)
	f.st.quiet(3 * opts.Interval)
	if got, _ := failovers(); got != count0+1 {
		t.Errorf("%v failover observations, want still 1", got-count0)
	}
}

// TestARPRepliesCounted: every answer written counts once.
func TestARPRepliesCounted(t *testing.T) {
	metrics.Register()
	f := newFixture(t, testOptions())
	f.run()
	replies := func() (float64, error) { return testutil.GetCounterMetricValue(metrics.ARPReplies) }
	before, _ := replies()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	for range 3 {
		f.st.request(vip)
		f.st.next(wait)
	}
	f.st.request(otherIP) // not owned: not answered, not counted
	f.st.quiet(100 * time.Millisecond)
	if got := eventually(t, replies, before+3); got != before+3 {
		t.Errorf("labcloud_lb_arp_replies_total grew by %v, want 3", got-before)
	}
}
