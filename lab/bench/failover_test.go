package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/provider/placement"
)

func TestPercentiles(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want Percentiles
	}{
		{nil, Percentiles{}},
		{[]float64{7}, Percentiles{N: 1, P50: 7, P90: 7}},
		{[]float64{5, 1, 4, 2, 3}, Percentiles{N: 5, P50: 3, P90: 5}},
		{[]float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, Percentiles{N: 10, P50: 5, P90: 9}},
	} {
		if got := PercentilesOf(tc.xs); got != tc.want {
			t.Errorf("PercentilesOf(%v) = %+v, want %+v", tc.xs, got, tc.want)
		}
	}
}

func secs(f float64) *float64 { return &f }

// Missing figures are left out of their percentiles, not counted as zero,
// and each kind is summarized apart.
func TestSummarizeFailovers(t *testing.T) {
	runs := []FailoverRun{
		{Kind: FailoverCrash, Seconds: secs(1.2), GARPSeconds: secs(0.010), NeighbourSeconds: secs(0.011), EligibleAgainSeconds: secs(40)},
		{Kind: FailoverCrash, Seconds: secs(1.0), GARPSeconds: secs(0.020), NeighbourSeconds: nil, EligibleAgainSeconds: secs(42)},
		{Kind: FailoverCrash, Seconds: nil, GARPSeconds: secs(0.015), NeighbourSeconds: secs(0.016), EligibleAgainSeconds: secs(41)},
		{Kind: FailoverStop, Seconds: secs(0.3), GARPSeconds: secs(0.030), LibvirtEventSeconds: secs(0.025), GARPAfterEventSeconds: secs(0.005)},
	}
	got := summarizeFailovers(runs)
	crash := got[FailoverCrash]
	if crash.Runs != 3 || crash.Client != (Percentiles{N: 2, P50: 1.0, P90: 1.2}) ||
		crash.GARP != (Percentiles{N: 3, P50: 0.015, P90: 0.020}) || crash.Neighbour.N != 2 ||
		crash.EligibleAgain != (Percentiles{N: 3, P50: 41, P90: 42}) || crash.LibvirtEvent.N != 0 {
		t.Errorf("crash summary = %+v", crash)
	}
	stop := got[FailoverStop]
	if stop.Runs != 1 || stop.GARPAfterEvent != (Percentiles{N: 1, P50: 0.005, P90: 0.005}) || stop.Client.P50 != 0.3 {
		t.Errorf("stop summary = %+v", stop)
	}
}

// The client's figure is the first request started after the trigger that
// a surviving pod answered, by the time it ended.
func TestFirstAnswer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	alive := func(who string) bool { return strings.HasPrefix(who, "pod-") && who != "pod-dead" }
	as := []attempt{
		{start: at(-50), end: at(20), answer: "pod-a"},     // started before the trigger
		{start: at(0), end: at(1000), answer: ""},          // timed out
		{start: at(100), end: at(900), answer: "pod-dead"}, // the dead node's pod
		{start: at(300), end: at(350), answer: "pod-b"},    // ended first
		{start: at(200), end: at(400), answer: "pod-c"},
	}
	got, ok := firstAnswer(as, t0, alive)
	if !ok || got.answer != "pod-b" || !got.end.Equal(at(350)) {
		t.Fatalf("firstAnswer = %+v %v, want pod-b ending at +350ms", got, ok)
	}
	if _, ok := firstAnswer(as[:3], t0, alive); ok {
		t.Fatal("an answer found among attempts with none acceptable")
	}
}

// The prober opens a new connection every period whatever the earlier
// requests do: a server that hangs the first requests and then answers
// is answered within a period of recovering.
func TestProberKeepsOpeningConnections(t *testing.T) {
	var up atomic.Bool
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			time.Sleep(2 * time.Second) // a dead path: the client times out
			return
		}
		fmt.Fprintln(w, "pod-b")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	p := startProber(strings.TrimPrefix(srv.URL, "http://"), 50*time.Millisecond)
	trigger := time.Now()
	time.Sleep(300 * time.Millisecond)
	recovered := time.Now()
	up.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := p.wait(ctx, trigger, func(who string) bool { return who == "pod-b" })
	p.stop()
	if err != nil {
		t.Fatal(err)
	}
	if d := a.end.Sub(recovered); d < 0 || d > 500*time.Millisecond {
		t.Errorf("answered %s after the server recovered, want within a few periods", d)
	}
	if n := conns.Load(); n < 6 {
		t.Errorf("%d connections opened, want one per period while the first hang", n)
	}
}

func TestReportedSince(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 500_000_000, time.UTC)
	node := func(status v1.ConditionStatus, hb time.Time) *v1.Node {
		return &v1.Node{Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(hb)}}}}
	}
	old := node(v1.ConditionTrue, start.Add(-30*time.Second))
	for _, tc := range []struct {
		name string
		n    *v1.Node
		want bool
	}{
		{"the report from before the restart", old, false},
		{"NotReady after the start", node(v1.ConditionFalse, start.Add(5*time.Second)), false},
		{"Ready after the start", node(v1.ConditionTrue, start.Add(5*time.Second)), true},
		// Heartbeats have whole seconds: one in the start's second counts.
		{"Ready in the start's second", node(v1.ConditionTrue, start.Truncate(time.Second)), true},
		{"no Ready condition", &v1.Node{}, false},
	} {
		if got := reportedSince(tc.n, start, placement.ReadyReport(old)); got != tc.want {
			t.Errorf("%s: reportedSince = %v, want %v", tc.name, got, tc.want)
		}
	}
}
