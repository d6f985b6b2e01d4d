package lbtest

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

// Events keeps what Recorder recorded, as "Type Reason message".
type Events struct {
	Recorder *record.FakeRecorder

	mu  sync.Mutex
	all []string // drained from Recorder
}

// NewEvents records up to 1000 events not yet drained.
func NewEvents() *Events { return &Events{Recorder: record.NewFakeRecorder(1000)} }

// Drain moves the recorded events into the kept ones and returns them all.
func (e *Events) Drain() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		select {
		case ev := <-e.Recorder.Events:
			e.all = append(e.all, ev)
		default:
			return append([]string(nil), e.all...)
		}
	}
}

// Count is the number of events of this type and reason so far.
func (e *Events) Count(typ, reason string) int {
	n := 0
	for _, ev := range e.Drain() {
		if strings.HasPrefix(ev, typ+" "+reason+" ") {
			n++
		}
	}
	return n
}

// Cluster is what a test's fixture waits on and changes: the test, its
// context, the fake cluster's client and the events recorded.
type Cluster struct {
	t      testing.TB
	ctx    context.Context
	client kubernetes.Interface
	events *Events
}

// NewCluster is the cluster of client, whose events go to events.
func NewCluster(t testing.TB, ctx context.Context, client kubernetes.Interface, events *Events) Cluster {
	return Cluster{t: t, ctx: ctx, client: client, events: events}
}

// Drain is every event recorded so far (Events.Drain).
func (c Cluster) Drain() []string { return c.events.Drain() }

// Count is the number of events of this type and reason so far.
func (c Cluster) Count(typ, reason string) int { return c.events.Count(typ, reason) }

// WaitFor polls cond for up to 10 s (placement works asynchronously) and
// fails the test, with the events so far, if it does not hold by then.
func (c Cluster) WaitFor(what string, cond func() bool) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		c.t.Fatalf("%s did not happen; events: %q", what, c.events.Drain())
	}
}

// Counter reads a counter now and returns how much it has grown since.
func Counter(t testing.TB, c k8smetrics.CounterMetric) func() float64 {
	t.Helper()
	read := func() float64 {
		v, err := testutil.GetCounterMetricValue(c)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	start := read()
	return func() float64 { return read() - start }
}

// SetReady sets n's Ready condition as kube-controller-manager (Unknown,
// NodeStatusUnknown) or a kubelet (True, False) reports it, the status
// having changed at changed.
func (c Cluster) SetReady(n Node, status v1.ConditionStatus, changed time.Time) {
	c.t.Helper()
	obj := n.Object()
	ready := &obj.Status.Conditions[0]
	ready.Status, ready.LastTransitionTime = status, metav1.NewTime(changed)
	if status == v1.ConditionUnknown {
		ready.Reason = "NodeStatusUnknown"
	}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, obj, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// Main registers labcloud's metrics, as the CCM's main does before the
// provider starts (a metric vector's child taken before registration
// would count nothing), then runs the tests: a TestMain.
func Main(m *testing.M) {
	metrics.Register()
	os.Exit(m.Run())
}
