package netroutes

import (
	"testing"

	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

// TestRouteWritesMetric: labcloud_routes_writes_total counts each netlink
// write under its operation, and a converged pass adds nothing.
func TestRouteWritesMetric(t *testing.T) {
	metrics.Register()
	_, m := newLab(t, Config{})
	counts := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, op := range []string{metrics.OpAdd, metrics.OpReplace, metrics.OpDelete} {
			v, err := testutil.GetCounterMetricValue(metrics.RouteWrites.WithLabelValues(op))
			if err != nil {
				t.Fatal(err)
			}
			out[op] = v
		}
		return out
	}
	step := func(what string, desired []Route, add, replace, del float64) {
		t.Helper()
		before := counts()
		mustReconcile(t, m, desired)
		after := counts()
		for op, want := range map[string]float64{metrics.OpAdd: add, metrics.OpReplace: replace, metrics.OpDelete: del} {
			if got := after[op] - before[op]; got != want {
				t.Errorf("%s: %v %s writes counted, want %v", what, got, op, want)
			}
		}
	}
	old := []Route{rt("10.244.1.0/24", "192.168.100.11"), rt("fd10:244:1::/64", "fd00:100::11")}
	moved := []Route{rt("10.244.1.0/24", "192.168.100.21"), rt("fd10:244:1::/64", "fd00:100::21")}
	step("install", old, 2, 0, 0)
	step("again", old, 0, 0, 0)
	step("gateways change", moved, 0, 2, 0)
	step("nodes gone", nil, 0, 0, 2)
	step("nothing left", nil, 0, 0, 0)
}
