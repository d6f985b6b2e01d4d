package lbtest

import (
	"context"
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

// WaitFor polls cond for up to 10 s (placement works asynchronously) and
// fails t, with the events so far, if it does not hold by then.
func WaitFor(t testing.TB, ctx context.Context, events *Events, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s did not happen; events: %q", what, events.Drain())
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
func SetReady(t testing.TB, ctx context.Context, client kubernetes.Interface, n Node, status v1.ConditionStatus, changed time.Time) {
	t.Helper()
	obj := n.Object()
	c := &obj.Status.Conditions[0]
	c.Status, c.LastTransitionTime = status, metav1.NewTime(changed)
	if status == v1.ConditionUnknown {
		c.Reason = "NodeStatusUnknown"
	}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
