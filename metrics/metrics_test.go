package metrics

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/version"
)

// TestRegistered: every metric is in the legacy registry under labcloud_,
// with help text, passes Prometheus' linter, and build_info says the
// version.
func TestRegistered(t *testing.T) {
	Register()
	Register() // once only: a second call must not panic on duplicates
	// Vectors show up once they have a child.
	PoolAddresses.WithLabelValues("p").Set(3)
	PoolAddressesInUse.WithLabelValues("p").Set(1)
	Allocations.WithLabelValues("p").Inc()
	Releases.WithLabelValues("p").Inc()
	VIPMoves.WithLabelValues(MoveDomainDown).Inc()
	LibvirtReconnects.WithLabelValues("z").Inc()
	LibvirtCallSeconds.WithLabelValues("GetState").Observe(0.001)
	LibvirtDomains.WithLabelValues("z").Set(2)
	LibvirtUnparsableDomains.WithLabelValues("z").Set(1)
	RouteWrites.WithLabelValues(OpAdd).Inc()
	BGPSessionUp.WithLabelValues("192.0.2.1").Set(1)
	BGPAcceptedRoutes.WithLabelValues("192.0.2.1").Set(0)

	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	found := map[string]bool{}
	for _, mf := range families {
		if !strings.HasPrefix(mf.GetName(), "labcloud_") {
			continue
		}
		found[mf.GetName()] = true
		if help := strings.TrimPrefix(mf.GetHelp(), "[ALPHA] "); len(help) < 20 {
			t.Errorf("%s: help %q says too little", mf.GetName(), mf.GetHelp())
		}
		if _, err := testutil.MetricFamilyToText(&text, mf); err != nil {
			t.Fatal(err)
		}
		if mf.GetName() == "labcloud_build_info" {
			m := mf.GetMetric()
			if len(m) != 1 || m[0].GetGauge().GetValue() != 1 {
				t.Fatalf("labcloud_build_info = %v, want one sample of 1", m)
			}
			labels := map[string]string{}
			for _, l := range m[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["version"] != version.Get() || labels["go_version"] != runtime.Version() {
				t.Errorf("labcloud_build_info labels %v, want version %q and go_version %q", labels, version.Get(), runtime.Version())
			}
		}
	}
	if len(found) != 21 {
		t.Errorf("%d labcloud_* metrics gathered (%v), want 21", len(found), found)
	}
	problems, err := testutil.NewPromLinter(&text).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s", p.String())
	}
}
