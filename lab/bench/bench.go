package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// Result is what `labcloud bench` measures on a running lab.
type Result struct {
	UpSteps        []lab.Step `json:"upSteps"`
	UpTotalSeconds float64    `json:"upTotalSeconds"`
	// UpToFirstAnswerSeconds: up started -> a pod answered through a
	// LoadBalancer VIP (lab.FirstAnswerStep), the same steps counted.
	UpToFirstAnswerSeconds float64 `json:"upToFirstAnswerSeconds"`
	// UpRestoredSeconds is UpToFirstAnswerSeconds of a lab restored from
	// a snapshot (labcloud up a second time); null when the lab booted.
	UpRestoredSeconds *float64 `json:"upRestoredSeconds"`
	// ServiceToAnswer: Service created -> first HTTP answer from a pod
	// through its VIP, one per run.
	ServiceToAnswer    []float64 `json:"serviceToAnswerSeconds"`
	ServiceToAnswerP50 float64   `json:"serviceToAnswerP50Seconds"`
	// Failovers: every failover run, crashes first, then graceful stops
	// (FailoverRun.Kind), each with its figures.
	Failovers []FailoverRun `json:"failovers"`
	// FailoverP50: crash runs, the announcing node's QEMU killed -> first
	// HTTP answer through the VIP from a client opening a new connection
	// every 100 ms (FailoverRun.Seconds).
	FailoverP50 float64 `json:"failoverP50Seconds"`
	// FailoverSummary: p50 and p90 of each figure over the runs of a kind
	// ("crash", "stop").
	FailoverSummary map[string]FailoverSummary `json:"failoverSummary"`
	// RSSMiB of each daemon and guest (QEMU), and their sum.
	RSSMiB      map[string]float64 `json:"rssMiB"`
	LabRSSMiB   float64            `json:"labRSSMiB"`
	GuestRSSMiB float64            `json:"guestRSSMiBEach"`
}

// Failover kinds.
const (
	// FailoverCrash: SIGKILL of the node's QEMU process.
	FailoverCrash = "crash"
	// FailoverStop: `labcloud node stop` (libvirt's destroy of the domain).
	FailoverStop = "stop"
)

// FailoverRun is one failover: the node answering the VIP goes down at the
// trigger (kill or stop), and every figure is seconds from the trigger, by
// the host's clock, stamped where it was seen: libvirt's lifecycle event on
// the bench's own connection, the gratuitous ARP on the bridge (raw
// socket), the host's neighbour entry (netlink), the client's HTTP answer.
// A figure that could not be seen within its bound is null, and Errors says
// why.
type FailoverRun struct {
	Kind string `json:"kind"`
	VIP  string `json:"vip"`
	From string `json:"from"`
	// To is the pod that answered the client first; ToNode the node the
	// VIP moved to (whose MAC the gratuitous ARP names).
	To     string `json:"to"`
	ToNode string `json:"toNode"`
	// Seconds: first successful HTTP request through the VIP, from a client
	// on the host opening a new connection every 100 ms (only requests
	// started after the trigger count).
	Seconds *float64 `json:"seconds"`
	// LibvirtEventSeconds: libvirt reports the domain stopped.
	LibvirtEventSeconds *float64 `json:"libvirtEventSeconds"`
	// GARPSeconds: first announcement of the VIP naming another node's MAC
	// on the bridge (gratuitous ARP; for an IPv6 VIP an unsolicited
	// Neighbor Advertisement); GARPAfterEventSeconds the same from the
	// libvirt event: the CCM's own reaction time.
	GARPSeconds           *float64 `json:"garpSeconds"`
	GARPAfterEventSeconds *float64 `json:"garpAfterEventSeconds"`
	// NeighbourSeconds: the host's neighbour entry for the VIP names
	// another node's MAC.
	NeighbourSeconds *float64 `json:"neighbourSeconds"`
	// EligibleAgainSeconds: from the node's start after the run to its Node
	// reporting Ready again, which the CCM requires before it places a VIP
	// on a node whose domain went down.
	EligibleAgainSeconds *float64 `json:"eligibleAgainSeconds"`
	Errors               []string `json:"errors,omitempty"`
}

// FailoverSummary holds, for one kind of failover, the percentiles of each
// figure over the runs that measured it.
type FailoverSummary struct {
	Runs           int         `json:"runs"`
	Client         Percentiles `json:"client"`
	LibvirtEvent   Percentiles `json:"libvirtEvent"`
	GARP           Percentiles `json:"garp"`
	GARPAfterEvent Percentiles `json:"garpAfterEvent"`
	Neighbour      Percentiles `json:"neighbour"`
	EligibleAgain  Percentiles `json:"eligibleAgain"`
}

const app = "labcloud-bench"

// Run measures, on the running lab (inside its namespace), with a
// Deployment of one agnhost netexec per node behind LoadBalancer Services:
// Service created -> answered (2 x runs), then runs failovers of each kind
// (crash, stop) of the node answering a VIP, and reads the memory of every
// daemon and guest. Each failover run starts with every node eligible.
func Run(ctx context.Context, st *lab.State, runs int, out io.Writer) (*Result, error) {
	client, err := lab.AdminClient(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	res := &Result{UpSteps: st.Steps, RSSMiB: map[string]float64{}}
	res.UpTotalSeconds, res.UpToFirstAnswerSeconds = upSeconds(st.Steps)
	how := "booted"
	if st.Snapshot != "" {
		res.UpRestoredSeconds = &res.UpToFirstAnswerSeconds
		how = "restored from snapshot " + st.Snapshot
	}
	fmt.Fprintf(out, "up (%s): %.1fs to the first answer through a VIP, %.1fs in all\n", how, res.UpToFirstAnswerSeconds, res.UpTotalSeconds)
	// libvirt's event loop must exist before the connection that wants
	// events is opened.
	if err := libvirtcloud.StartEventLoop(); err != nil {
		return nil, err
	}
	if err := startPods(ctx, client, len(st.Nodes)); err != nil {
		return nil, err
	}
	defer client.AppsV1().Deployments("default").Delete(context.Background(), app, metav1.DeleteOptions{})

	for i := range 2 * runs {
		d, err := serviceToAnswer(ctx, client, fmt.Sprintf("%s-%d", app, i))
		if err != nil {
			return res, fmt.Errorf("service run %d: %w", i+1, err)
		}
		fmt.Fprintf(out, "service run %d: VIP answered by a pod %.3fs after the Service was created\n", i+1, d)
		res.ServiceToAnswer = append(res.ServiceToAnswer, d)
	}
	res.ServiceToAnswerP50 = PercentilesOf(res.ServiceToAnswer).P50

	svc, err := client.CoreV1().Services("default").Create(ctx, service(app), metav1.CreateOptions{})
	if err != nil {
		return res, fmt.Errorf("create bench Service: %w", err)
	}
	defer client.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	vip, err := waitIngress(ctx, client, svc.Name)
	if err != nil {
		return res, err
	}
	fb, err := newFailoverBench(ctx, client, st, vip)
	if err != nil {
		return res, err
	}
	defer fb.close()
	for _, kind := range []string{FailoverCrash, FailoverStop} {
		for i := range runs {
			run, err := fb.once(ctx, kind)
			res.Failovers = append(res.Failovers, run)
			fmt.Fprintf(out, "%s run %d: %s\n", kind, i+1, run.describe())
			if err != nil {
				res.FailoverSummary = summarizeFailovers(res.Failovers)
				return res, fmt.Errorf("%s run %d: %w", kind, i+1, err)
			}
		}
	}
	res.FailoverSummary = summarizeFailovers(res.Failovers)
	res.FailoverP50 = res.FailoverSummary[FailoverCrash].Client.P50

	for name, pid := range st.Pids {
		if rss, err := host.RSSMiB(pid); err == nil {
			res.RSSMiB[name] = rss
			res.LabRSSMiB += rss
		}
	}
	qemus := host.QEMUs(lab.NodePrefix)
	for _, n := range st.Nodes {
		if pid, err := host.OneQEMU(qemus, n); err == nil {
			if rss, err := host.RSSMiB(pid); err == nil {
				res.RSSMiB["qemu "+n] = rss
				res.LabRSSMiB += rss
				res.GuestRSSMiB = max(res.GuestRSSMiB, rss)
			}
		}
	}
	return res, nil
}

// startPods runs agnhost netexec on every node (one pod each, spread
// by anti-affinity) and waits until all are ready.
func startPods(ctx context.Context, client kubernetes.Interface, nodes int) error {
	labels := map[string]string{"app": app}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(nodes)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Affinity: &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: "kubernetes.io/hostname",
						}},
					}},
					Containers: []v1.Container{{
						Name: "netexec", Image: image.AgnhostImage, Args: []string{"netexec", "--http-port=8080"},
						ReadinessProbe: &v1.Probe{PeriodSeconds: 1, ProbeHandler: v1.ProbeHandler{
							HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
					}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create bench Deployment: %w", err)
	}
	return waitPods(ctx, client, nodes)
}

func waitPods(ctx context.Context, client kubernetes.Interface, nodes int) error {
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		d, err := client.AppsV1().Deployments("default").Get(ctx, app, metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == int32(nodes) && d.Status.UpdatedReplicas == int32(nodes), nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("bench pods not all ready within 5 minutes")
	}
	return err
}

func service(name string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": app},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}}},
	}
}

// serviceToAnswer creates a Service and times its VIP's first HTTP answer
// from a pod, then deletes the Service and waits until it is gone.
func serviceToAnswer(ctx context.Context, client kubernetes.Interface, name string) (float64, error) {
	start := time.Now()
	if _, err := client.CoreV1().Services("default").Create(ctx, service(name), metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	defer func() {
		_ = client.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			_, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
			return err != nil, nil
		})
	}()
	var vip string
	for deadline := start.Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if vip == "" {
			s, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
			if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
				vip = s.Status.LoadBalancer.Ingress[0].IP
			}
			continue
		}
		if strings.HasPrefix(answer(vip), app) {
			return time.Since(start).Seconds(), nil
		}
	}
	return 0, fmt.Errorf("service %s (VIP %q) not answered by a pod within 2 minutes", name, vip)
}

func waitIngress(ctx context.Context, client kubernetes.Interface, name string) (string, error) {
	var vip string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		s, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			vip = s.Status.LoadBalancer.Ingress[0].IP
			return true, nil
		}
		return false, nil
	})
	if err != nil && ctx.Err() == nil {
		return "", fmt.Errorf("service %s got no VIP in 60s", name)
	}
	return vip, err
}

// answer asks the VIP who answers: a pod name, or "" within 500 ms.
func answer(vip string) string { return lanprobe.Hostname(vip, 500*time.Millisecond) }

// upSeconds is the lab's own time in up's steps (building tools and
// waiting for another user of libvirtd are not), in all and up to its
// first answer through a VIP (0 if up never got there).
func upSeconds(steps []lab.Step) (total, toFirstAnswer float64) {
	answered := false
	for _, s := range steps {
		if strings.HasPrefix(s.Name, "control-plane tools") || strings.HasPrefix(s.Name, "build ") || strings.HasPrefix(s.Name, "claim ") {
			continue
		}
		total += s.Seconds
		if !answered {
			toFirstAnswer += s.Seconds
			answered = s.Name == lab.FirstAnswerStep
		}
	}
	if !answered {
		toFirstAnswer = 0
	}
	return total, toFirstAnswer
}
