package explain

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodState(t *testing.T) {
	for _, tt := range []struct {
		name string
		pod  v1.PodStatus
		want string
	}{
		{"no status yet", v1.PodStatus{}, "no phase yet"},
		{"running", v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{
			{Name: "netexec", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}}, "Running"},
		{"init and main waiting", v1.PodStatus{Phase: v1.PodPending,
			InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}},
			ContainerStatuses:     []v1.ContainerStatus{{Name: "netexec", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{}}}}},
			"Pending, container init waiting: ImagePullBackOff, container netexec waiting: no reason given"},
	} {
		if got := PodState(&v1.Pod{Status: tt.pod}); got != tt.want {
			t.Errorf("%s: PodState = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestEventTime: events.k8s.io events set EventTime and their series'
// LastObservedTime, not LastTimestamp; the newest must still win.
func TestEventTime(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	core := &v1.Event{InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "p"}, Type: v1.EventTypeWarning, Reason: "Old",
		LastTimestamp: metav1.NewTime(t0)}
	series := &v1.Event{InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "p"}, Type: v1.EventTypeWarning, Reason: "New",
		EventTime: metav1.NewMicroTime(t0.Add(-time.Hour)), Series: &v1.EventSeries{LastObservedTime: metav1.NewMicroTime(t0.Add(time.Minute))}}
	created := &v1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0.Add(-time.Minute))},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "p"}, Type: v1.EventTypeWarning, Reason: "Older"}
	if e := newestWarning([]v1.Event{*core, *series, *created}, "Pod", "p", ""); e == nil || e.Reason != "New" {
		t.Errorf("newestWarning = %+v, want the series' event", e)
	}
	if e := newestWarning([]v1.Event{*core}, "Service", "p", ""); e != nil {
		t.Errorf("newestWarning of another kind = %+v, want none", e)
	}
}

func TestShorten(t *testing.T) {
	for _, tt := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"two\n  lines\t here ", 100, "two lines here"},
		{"0123456789abc", 10, "0123456..."},
		{"ééééé", 8, "éé..."}, // cut on a rune boundary: é is two bytes
	} {
		if got := Shorten(tt.in, tt.max); got != tt.want {
			t.Errorf("Shorten(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
	}
}
