package up

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/labcloud/labcloud/lab/explain"
)

// event is an event about the object of that kind, name and uid in
// "default", last seen at.
func event(name, kind, object string, uid types.UID, typ, reason, message string, at time.Time) *v1.Event {
	return &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "default"},
		InvolvedObject: v1.ObjectReference{Kind: kind, Namespace: "default", Name: object, UID: uid},
		Type:           typ, Reason: reason, Message: message,
		LastTimestamp: metav1.NewTime(at),
	}
}

// TestWhyNoAnswer is the case seen on a host: the sandbox of the first
// answer's pod could not be made, and the error said only "running -".
func TestWhyNoAnswer(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "labcloud-first-answer-x7k2p", Namespace: "default", UID: "pod-uid"},
		Status: v1.PodStatus{Phase: v1.PodPending, ContainerStatuses: []v1.ContainerStatus{
			{Name: "netexec", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}},
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: firstAnswerApp, Namespace: "default"}}
	sandbox := `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to create containerd task: failed to create shim task: OCI runtime create failed: unknown version specified`
	long := sandbox + ": " + strings.Repeat("x", 400)
	client := fake.NewClientset(pod, svc,
		event("e1", "Pod", pod.Name, pod.UID, v1.EventTypeNormal, "Scheduled", "Successfully assigned default/x to lab-node-1", t0),
		event("e2", "Pod", pod.Name, pod.UID, v1.EventTypeWarning, "FailedMount", "an older warning", t0.Add(time.Second)),
		event("e3", "Pod", pod.Name, pod.UID, v1.EventTypeWarning, "FailedCreatePodSandBox", long, t0.Add(2*time.Second)),
		event("e4", "Pod", "another-pod", "other-uid", v1.EventTypeWarning, "BackOff", "not this pod's", t0.Add(time.Minute)),
		event("e5", "Pod", pod.Name, "uid-of-an-earlier-pod-of-that-name", v1.EventTypeWarning, "Failed", "not this pod's either", t0.Add(time.Minute)),
		event("e6", "Service", svc.Name, "", v1.EventTypeWarning, "SyncLoadBalancerFailed", "no pool has an address left", t0),
	)

	got := whyNoAnswer(context.Background(), client, pod, svc, "")
	lines := strings.Split(got, "\n")
	if len(lines) != 3 || lines[0] != "" {
		t.Fatalf("want two lines of their own, got %q", got)
	}
	podLine := lines[1]
	for _, want := range []string{
		"  pod labcloud-first-answer-x7k2p: Pending, container netexec waiting: ContainerCreating; ",
		"last Warning event FailedCreatePodSandBox: " + sandbox,
	} {
		if !strings.Contains(podLine, want) {
			t.Errorf("pod line does not say %q:\n%s", want, podLine)
		}
	}
	_, said, _ := strings.Cut(podLine, "last Warning event ")
	if !strings.HasSuffix(said, "...") || len(said) > explain.MaxLen {
		t.Errorf("the event is not shortened to %d bytes (%d): %s", explain.MaxLen, len(said), said)
	}
	if want := "  Service labcloud-first-answer: no VIP; last Warning event SyncLoadBalancerFailed: no pool has an address left"; lines[2] != want {
		t.Errorf("Service line = %q, want %q", lines[2], want)
	}

	// With a VIP, the Service is not what is missing.
	if got := whyNoAnswer(context.Background(), client, pod, svc, "10.123.0.200"); strings.Contains(got, "Service") {
		t.Errorf("with a VIP, whyNoAnswer still speaks of the Service: %q", got)
	}
}

func TestWhyNoAnswerWithoutEvents(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "default"}}
	got := whyNoAnswer(context.Background(), fake.NewClientset(pod), pod, svc, "10.123.0.200")
	if want := "\n  pod p: Running; no Warning event"; got != want {
		t.Errorf("whyNoAnswer = %q, want %q", got, want)
	}
	got = whyNoAnswer(context.Background(), fake.NewClientset(), pod, svc, "10.123.0.200")
	if !strings.Contains(got, `pod p: pods "p" not found`) {
		t.Errorf("for a pod that is gone, whyNoAnswer = %q", got)
	}
}

// TestFirstAnswerStop: an up that fails before the answer ends the wait
// and leaves neither the pod nor the Service behind.
func TestFirstAnswerStop(t *testing.T) {
	client := fake.NewClientset()
	r, err := startFirstAnswer(context.Background(), client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r.stop()
	select {
	case err := <-r.done:
		if err == nil {
			t.Error("the stopped wait reports an answer")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait still runs 10 s after stop")
	}
	pods, _ := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	svcs, _ := client.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{})
	if len(pods.Items)+len(svcs.Items) != 0 {
		t.Errorf("left behind: %d pods, %d Services", len(pods.Items), len(svcs.Items))
	}
}
