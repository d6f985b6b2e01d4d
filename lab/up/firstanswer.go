package up

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lab/explain"
	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/lab/lanprobe"
)

const firstAnswerApp = "labcloud-first-answer"

// firstAnswerBound is how long the first answer may take once every node
// is up: a pod's start on a busy TCG node, and the VIP's announcement.
const firstAnswerBound = 3 * time.Minute

// FirstAnswer creates the first answer's pod and its LoadBalancer
// Service, and starts waiting up to Wait for the pod to answer through
// the VIP (startFirstAnswer); AwaitFirstAnswer has the result.
type FirstAnswer struct {
	Cluster *Cluster
	Wait    time.Duration
	run     *firstAnswerRun // made: the wait, running
}

func (a *FirstAnswer) Execute(ctx context.Context, _ *Env) (err error) {
	a.run, err = startFirstAnswer(ctx, a.Cluster.Client, a.Wait)
	return err
}

// stop ends the wait and deletes the pod and the Service, if they were
// made: what an up that failed after FirstAnswer leaves undone.
func (a *FirstAnswer) stop() {
	if a.run != nil {
		a.run.stop()
	}
}

// AwaitFirstAnswer returns the first answer's result, printing its
// timeline; FirstAnswer.stop deletes the pod and the Service after (a
// snapshot taken in between keeps them for the restored lab's answer).
type AwaitFirstAnswer struct {
	FirstAnswer *FirstAnswer
}

func (a *AwaitFirstAnswer) Execute(_ context.Context, env *Env) error {
	return a.FirstAnswer.run.await(env.Opts.Out)
}

// RestoredAnswer waits up to Wait for the first answer's pod, restored
// with the lab, to answer through its Service's VIP again.
type RestoredAnswer struct {
	Cluster *Cluster
	Wait    time.Duration
	FirstAnswer
}

func (a *RestoredAnswer) Execute(ctx context.Context, env *Env) error {
	client := a.Cluster.Client
	svc, err := client.CoreV1().Services("default").Get(ctx, firstAnswerApp, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the snapshot's first answer: %w", err)
	}
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + firstAnswerApp})
	if err != nil {
		return err
	}
	if len(pods.Items) != 1 {
		return fmt.Errorf("the snapshot holds %d first-answer pods, want 1", len(pods.Items))
	}
	ctx, cancel := context.WithCancel(ctx)
	a.run = &firstAnswerRun{client: client, pod: &pods.Items[0], svc: svc, created: time.Now(), done: make(chan error, 1), cancel: cancel}
	go func() { a.run.done <- a.run.wait(ctx, a.Wait) }()
	return a.run.await(env.Opts.Out)
}

// firstAnswerRun is the first answer's pod and Service, created before
// the nodes are up (the pod runs on the first node that can take it), and
// the wait for the pod's answer through the Service's VIP, which starts
// with them so that the timeline counts from the pod's creation.
type firstAnswerRun struct {
	client   kubernetes.Interface
	pod      *v1.Pod
	svc      *v1.Service
	created  time.Time
	timeline firstAnswerTimeline // the wait's own until done has its result
	done     chan error
	cancel   context.CancelFunc // ends the wait early
	stopped  sync.Once
}

// startFirstAnswer creates an agnhost netexec pod and a LoadBalancer
// Service in front of it, and starts waiting, up to timeout, for the pod
// to answer through the VIP from this host (the lab's namespace), as a
// client on the LAN would reach it. await has the result.
func startFirstAnswer(ctx context.Context, client kubernetes.Interface, timeout time.Duration) (*firstAnswerRun, error) {
	labels := map[string]string{"app": firstAnswerApp}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: firstAnswerApp + "-", Namespace: "default", Labels: labels},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []v1.Container{{Name: "netexec", Image: image.AgnhostImage, Args: []string{"netexec", "--http-port=8080"},
				ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/hostname", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}}},
		},
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &firstAnswerRun{client: client, created: time.Now(), done: make(chan error, 1), cancel: cancel}
	var err error
	if r.pod, err = client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		cancel()
		return nil, err
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: firstAnswerApp, Namespace: "default"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Selector: labels,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if r.svc, err = client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		cancel()
		r.cleanUp()
		return nil, err
	}
	go func() { r.done <- r.wait(ctx, timeout) }()
	return r, nil
}

// await returns the wait's result, printing the timeline of an answer.
func (r *firstAnswerRun) await(out io.Writer) error {
	err := <-r.done
	if err == nil {
		fmt.Fprintf(out, "           %s\n", r.timeline)
	}
	return err
}

// stop ends the wait, if it still runs, and deletes the pod and the
// Service, once.
func (r *firstAnswerRun) stop() {
	r.stopped.Do(func() {
		r.cancel()
		r.cleanUp()
	})
}

// cleanUp deletes the pod and the Service, whichever exist.
func (r *firstAnswerRun) cleanUp() {
	if r.svc != nil {
		_ = r.client.CoreV1().Services("default").Delete(context.Background(), r.svc.Name, metav1.DeleteOptions{})
	}
	_ = r.client.CoreV1().Pods("default").Delete(context.Background(), r.pod.Name, metav1.DeleteOptions{})
}

// wait polls the pod, the Service and the VIP until the pod answers,
// noting when each part of that was first seen; on timeout it says what
// the answer is stuck on.
func (r *firstAnswerRun) wait(ctx context.Context, timeout time.Duration) error {
	client, p, svc, tl := r.client, r.pod, r.svc, &r.timeline
	var vip, got string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if cur, err := client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
			tl.sawPod(cur, time.Since(r.created))
		}
		if vip == "" {
			if s, err := client.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{}); err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
				vip = s.Status.LoadBalancer.Ingress[0].IP
				tl.vip = time.Since(r.created)
			}
			return false, nil
		}
		if tl.ready == 0 { // no endpoint to answer yet
			return false, nil
		}
		got = lanprobe.Hostname(vip, 500*time.Millisecond)
		return got == p.Name, nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("pod %s not answering through the VIP %q of Service %s after %s (last answer %q; %s)%s",
			p.Name, vip, svc.Name, timeout, got, tl, whyNoAnswer(ctx, client, p, svc, vip))
	}
	if err == nil {
		tl.answered = time.Since(r.created)
	}
	return err
}

// firstAnswerTimeline is when each part of the first answer was first
// seen, from the pod's creation.
type firstAnswerTimeline struct {
	scheduled, started, ready, vip, answered time.Duration
}

func (tl *firstAnswerTimeline) sawPod(p *v1.Pod, at time.Duration) {
	if tl.scheduled == 0 && p.Spec.NodeName != "" {
		tl.scheduled = at
	}
	for _, c := range p.Status.ContainerStatuses {
		if tl.started == 0 && c.State.Running != nil {
			tl.started = at
		}
	}
	for _, c := range p.Status.Conditions {
		if tl.ready == 0 && c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
			tl.ready = at
		}
	}
}

func (tl firstAnswerTimeline) String() string {
	part := func(name string, d time.Duration) string {
		if d == 0 {
			return name + " -"
		}
		return fmt.Sprintf("%s %.1fs", name, d.Seconds())
	}
	return strings.Join([]string{part("pod scheduled", tl.scheduled), part("running", tl.started), part("ready", tl.ready),
		part("VIP", tl.vip), part("answered", tl.answered)}, ", ")
}

// whyNoAnswer says, on lines of their own, what the first answer is stuck
// on: the pod's phase, its waiting containers and latest Warning event,
// and the Service's latest Warning event while it has no VIP. The
// timeline says which part is late; this says why (a sandbox the runtime
// refused leaves "running -" and the cause only in an event).
func whyNoAnswer(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, svc *v1.Service, vip string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	line := "\n  pod " + pod.Name + ": "
	if cur, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		line += err.Error()
	} else {
		line += explain.PodState(cur) + "; " + explain.LatestWarning(ctx, client, cur.Namespace, "Pod", cur.Name, cur.UID)
	}
	if vip != "" {
		return line
	}
	return line + "\n  Service " + svc.Name + ": no VIP; " + explain.LatestWarning(ctx, client, svc.Namespace, "Service", svc.Name, "")
}
