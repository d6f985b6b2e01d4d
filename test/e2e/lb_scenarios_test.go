package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider"
)

// lbNodes defines n running domains named prefix-1..n with Ready,
// initialized Nodes kept Ready by a heartbeat, and returns their MACs by
// node name.
func lbNodes(t testing.TB, prefix string, n int) map[string]net.HardwareAddr {
	t.Helper()
	macs := map[string]net.HardwareAddr{}
	var names []string
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		_, mac := defineDomain(t, name, true)
		macs[name], _ = net.ParseMAC(mac)
		createNode(t, name, v1.ConditionTrue)
		names = append(names, name)
	}
	for _, name := range names {
		waitNode(t, name, "initialization", 60*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })
	}
	heartbeat(t, names...)
	return macs
}

// otherNode is a node of macs other than name (the one of two).
func otherNode(macs map[string]net.HardwareAddr, name string) string {
	for n := range macs {
		if n != name {
			return n
		}
	}
	return ""
}

// heartbeat refreshes the Nodes' Ready heartbeat (keeping the status the
// test set) as a kubelet would, so that kube-controller-manager does not mark them Unknown
// during a long test.
func heartbeat(t testing.TB, names ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	reported := map[string]v1.ConditionStatus{} // what each "kubelet" last said
	for _, name := range names {
		reported[name] = v1.ConditionTrue
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, name := range names {
				n, err := env.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				for i := range n.Status.Conditions {
					c := &n.Status.Conditions[i]
					if c.Type != v1.NodeReady {
						continue
					}
					c.LastHeartbeatTime = metav1.Now()
					// kube-controller-manager marks a Node Unknown when it
					// has not heard from it in time (after an API server
					// outage, every Node); the kubelet's next report says
					// what it said before.
					if c.Status == v1.ConditionUnknown && c.Reason == "NodeStatusUnknown" {
						c.Status, c.Reason = reported[name], "KubeletReady"
					} else {
						reported[name] = c.Status
					}
				}
				_, _ = env.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// servicesGoneAtEnd deletes the test's Services (names starting with
// prefix) when the test ends and waits until their finalizers are removed,
// while the test's CCM still runs: call it right after startCCM, so that
// it runs before the CCM is stopped.
func servicesGoneAtEnd(t testing.TB, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := env.admin.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			left := 0
			for i := range list.Items {
				s := &list.Items[i]
				if !strings.HasPrefix(s.Name, prefix) {
					continue
				}
				left++
				if s.DeletionTimestamp == nil {
					_ = env.admin.CoreV1().Services("default").Delete(ctx, s.Name, metav1.DeleteOptions{})
				}
			}
			return left == 0, nil
		})
		if err != nil {
			t.Errorf("Services %s* not gone (finalizers left?): %v", prefix, err)
		}
	})
}

// serviceEvents returns the events about exactly this Service object.
func serviceEvents(t testing.TB, svc *v1.Service) []v1.Event {
	t.Helper()
	list, err := env.admin.CoreV1().Events(svc.Namespace).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(svc.UID)})
	if err != nil {
		t.Fatalf("events of %s: %v", svc.Name, err)
	}
	return list.Items
}

// eventCount is how many times reason was reported on svc (the recorder
// folds repeats into one Event with a count).
func eventCount(t testing.TB, svc *v1.Service, typ, reason string) int {
	t.Helper()
	n := 0
	for _, e := range serviceEvents(t, svc) {
		if e.Reason != reason || e.Type != typ {
			continue
		}
		n += max(int(e.Count), 1)
	}
	return n
}

func eventSummary(t testing.TB, svc *v1.Service) string {
	var b strings.Builder
	for _, e := range serviceEvents(t, svc) {
		fmt.Fprintf(&b, "\n  %s %s x%d: %s", e.Type, e.Reason, max(e.Count, 1), e.Message)
	}
	return b.String()
}

// waitEvent waits until reason was reported on svc at least once and
// returns the message.
func waitEvent(t testing.TB, svc *v1.Service, typ, reason string, timeout time.Duration) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, e := range serviceEvents(t, svc) {
			if e.Reason == reason && e.Type == typ {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s %s event on %s within %s; events:%s", typ, reason, svc.Name, timeout, eventSummary(t, svc))
	}
	return msg
}

// ingressIP returns the Service's first ingress IP, if it has one.
func ingressIP(t testing.TB, name string) (netip.Addr, bool) {
	t.Helper()
	s, err := env.admin.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service %s: %v", name, err)
	}
	if len(s.Status.LoadBalancer.Ingress) == 0 {
		return netip.Addr{}, false
	}
	return netip.MustParseAddr(s.Status.LoadBalancer.Ingress[0].IP), true
}

// deleteService deletes a Service and waits until the CCM removed its
// cleanup finalizer and it is gone.
func deleteService(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	if err := env.admin.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete service %s: %v", name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := env.admin.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("service %s still there 60s after delete (finalizer not removed)", name)
	}
}

// nodeWithMAC names the node whose MAC this is, "" if none.
func nodeWithMAC(macs map[string]net.HardwareAddr, mac net.HardwareAddr) string {
	for n, m := range macs {
		if mac != nil && m.String() == mac.String() {
			return n
		}
	}
	return ""
}

// Two Services ask for the same address: the first wins, the second is
// told it is taken and gets it once the first is deleted.
func TestLoadBalancerRequestedIPContention(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.40-10.88.0.45"), lbControllers)
	servicesGoneAtEnd(t, "contend-")
	macs := lbNodes(t, "e2e-lbip", 2)
	client := newLANClient(t, "10.88.0.6/24")
	want := netip.MustParseAddr("10.88.0.42")
	ask := map[string]string{lb.AnnotationIP: want.String()}

	createLBService(t, "contend-first", ask)
	if got, _ := waitVIP(t, "contend-first", 30*time.Second); got != want {
		t.Fatalf("contend-first got %s, want the requested %s", got, want)
	}
	second := createLBService(t, "contend-second", ask, 8080)
	msg := waitEvent(t, second, v1.EventTypeWarning, provider.ReasonTaken, 30*time.Second)
	if !strings.Contains(msg, "contend-first") {
		t.Errorf("%s message %q does not name the holder", provider.ReasonTaken, msg)
	}
	if ip, ok := ingressIP(t, "contend-second"); ok {
		t.Fatalf("contend-second got %s while %s is taken", ip, want)
	}

	start := time.Now()
	deleteService(t, "contend-first")
	if got, _ := waitVIP(t, "contend-second", 30*time.Second); got != want {
		t.Fatalf("contend-second got %s after the holder left, want %s", got, want)
	}
	t.Logf("contend-second got %s %s after contend-first's delete was requested", want, time.Since(start).Round(time.Millisecond))
	if n := eventCount(t, second, v1.EventTypeWarning, provider.ReasonTaken); n != 1 {
		t.Errorf("%d %s warnings on contend-second, want 1 across its retries:%s", n, provider.ReasonTaken, eventSummary(t, second))
	}
	if n := waitNodeARP(t, client, want, macs, 10*time.Second); n == "" {
		t.Fatalf("%s not answered by a node", want)
	}
}

// waitNodeARP polls until the client's ARP request for ip is answered with
// one of the nodes' MACs and returns that node's name.
func waitNodeARP(t testing.TB, c *lanClient, ip netip.Addr, macs map[string]net.HardwareAddr, timeout time.Duration) string {
	t.Helper()
	var (
		last net.HardwareAddr
		node string
	)
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		mac, err := c.Resolve(ip, 300*time.Millisecond)
		if err != nil {
			return false, err
		}
		last, node = mac, nodeWithMAC(macs, mac)
		return node != "", nil
	})
	if err != nil {
		t.Fatalf("ARP for %s from the LAN: answered by %v, want one of the nodes %v: %v", ip, last, macs, err)
	}
	return node
}

// A pool of two and three Services: the third waits, with one event, and
// gets the address the first gives back.
func TestLoadBalancerPoolExhaustedThenFreed(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.50-10.88.0.51"), lbControllers)
	servicesGoneAtEnd(t, "exh-")
	macs := lbNodes(t, "e2e-lbexh", 2)
	client := newLANClient(t, "10.88.0.7/24")

	createLBService(t, "exh-1", nil)
	first, _ := waitVIP(t, "exh-1", 30*time.Second)
	createLBService(t, "exh-2", nil)
	second, _ := waitVIP(t, "exh-2", 30*time.Second)
	if first == second {
		t.Fatalf("exh-1 and exh-2 both got %s", first)
	}
	third := createLBService(t, "exh-3", nil)
	waitEvent(t, third, v1.EventTypeWarning, provider.ReasonExhausted, 30*time.Second)
	if ip, ok := ingressIP(t, "exh-3"); ok {
		t.Fatalf("exh-3 got %s from an exhausted pool", ip)
	}

	start := time.Now()
	deleteService(t, "exh-1")
	got, _ := waitVIP(t, "exh-3", 30*time.Second)
	if got != first {
		t.Fatalf("exh-3 got %s, want %s, the address exh-1 released", got, first)
	}
	t.Logf("exh-3 got %s %s after exh-1's delete was requested", got, time.Since(start).Round(time.Millisecond))
	if n := eventCount(t, third, v1.EventTypeWarning, provider.ReasonExhausted); n != 1 {
		t.Errorf("%d %s warnings on exh-3, want 1 across its retries:%s", n, provider.ReasonExhausted, eventSummary(t, third))
	}
	waitNodeARP(t, client, got, macs, 10*time.Second)
}

// vipWatch records, through a watch, every ingress IP each Service ever
// showed.
type vipWatch struct {
	mu   sync.Mutex
	seen map[string][]netip.Addr // by Service name, distinct, in order
	bump chan struct{}
}

func watchVIPs(t testing.TB, prefix string) *vipWatch {
	w := &vipWatch{seen: map[string][]netip.Addr{}, bump: make(chan struct{}, 1)}
	observe := func(obj any) {
		s, ok := obj.(*v1.Service)
		if !ok || !strings.HasPrefix(s.Name, prefix) {
			return
		}
		w.mu.Lock()
		for _, ing := range s.Status.LoadBalancer.Ingress {
			ip, err := netip.ParseAddr(ing.IP)
			if err == nil && !slices.Contains(w.seen[s.Name], ip) {
				w.seen[s.Name] = append(w.seen[s.Name], ip)
			}
		}
		w.mu.Unlock()
		select {
		case w.bump <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(env.admin, 0, informers.WithNamespace("default"))
	inf := factory.Core().V1().Services().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	return w
}

// snapshot copies what was seen so far.
func (w *vipWatch) snapshot() map[string][]netip.Addr {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]netip.Addr, len(w.seen))
	for k, v := range w.seen {
		out[k] = slices.Clone(v)
	}
	return out
}

// waitCount waits until at least n Services showed an IP.
func (w *vipWatch) waitCount(n int, timeout time.Duration) (int, bool) {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		got := len(w.seen)
		w.mu.Unlock()
		if got >= n {
			return got, true
		}
		select {
		case <-w.bump:
		case <-deadline:
			return got, false
		}
	}
}

// The CCM is killed (SIGKILL) in the middle of a burst of 50 Services and
// started again: every Service ends with its own address, and no address
// a Service showed ever changes.
func TestLoadBalancerCCMKilledMidBurst(t *testing.T) {
	requireEnv(t)
	const n = 50
	cfg := lbCloudConfig("10.88.0.20-10.88.0.89")
	first := startCCM(t, cfg, lbControllers)
	servicesGoneAtEnd(t, "burst-")
	lbNodes(t, "e2e-lbburst", 2)
	w := watchVIPs(t, "burst-")

	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			svc := &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%02d", i), Namespace: "default"},
				Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer,
					Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
			}
			if _, err := env.admin.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
				t.Errorf("create %s: %v", svc.Name, err)
			}
		}()
	}
	// Kill as soon as a few Services have their address: the rest are
	// being created, queued or allocated right now.
	got, ok := w.waitCount(5, 60*time.Second)
	if !ok {
		t.Fatalf("only %d Services got an address before the kill deadline", got)
	}
	first.proc.Kill()
	before := w.snapshot()
	wg.Wait()
	t.Logf("CCM killed with %d of %d Services holding an address", len(before), n)
	if len(before) >= n {
		t.Fatalf("the whole burst finished before the kill; nothing was interrupted")
	}

	startCCM(t, cfg, lbControllers)
	servicesGoneAtEnd(t, "burst-") // while the second CCM still runs
	if got, ok := w.waitCount(n, 120*time.Second); !ok {
		t.Fatalf("after the restart only %d of %d Services got an address", got, n)
	}
	after := w.snapshot()
	owner := map[netip.Addr]string{}
	for name, ips := range after {
		if len(ips) != 1 {
			t.Errorf("%s showed %v: its address changed", name, ips)
		}
		if prev, ok := owner[ips[0]]; ok {
			t.Errorf("%s and %s both hold %s", prev, name, ips[0])
		}
		owner[ips[0]] = name
	}
	for name, ips := range before {
		if after[name][0] != ips[0] {
			t.Errorf("%s had %s before the kill and %s after the restart", name, ips[0], after[name][0])
		}
	}
	// The API agrees with the watch.
	for name := range after {
		if ip, ok := ingressIP(t, name); !ok || ip != after[name][len(after[name])-1] {
			t.Errorf("%s: status says %v, watch saw %v", name, ip, after[name])
		}
	}
}

// A malformed annotation gives one warning however often the service
// controller retries.
func TestLoadBalancerBadAnnotationWarnsOnce(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.60-10.88.0.61"), lbControllers)
	servicesGoneAtEnd(t, "badann-")
	svc := createLBService(t, "badann-1", map[string]string{lb.AnnotationIP: "10.88.0.300"})

	// Only a change of the Service can mend it: the service controller
	// tries once, and again only after 2 minutes (not on its own 5 s,
	// 10 s, ... backoff), so within 30 s there is one try and one Warning.
	retries := 0
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		retries = eventCount(t, svc, v1.EventTypeWarning, "SyncLoadBalancerFailed")
		return retries >= 1, nil
	})
	if err != nil {
		t.Fatalf("the service controller never tried:%s", eventSummary(t, svc))
	}
	time.Sleep(20 * time.Second)
	if retries = eventCount(t, svc, v1.EventTypeWarning, "SyncLoadBalancerFailed"); retries != 1 {
		t.Fatalf("the service controller tried %d times in 20 s, want once:%s", retries, eventSummary(t, svc))
	}
	if n := eventCount(t, svc, v1.EventTypeWarning, provider.ReasonInvalidRequest); n != 1 {
		t.Fatalf("%d %s warnings, want 1:%s", n, provider.ReasonInvalidRequest, eventSummary(t, svc))
	}
	if ip, ok := ingressIP(t, "badann-1"); ok {
		t.Fatalf("a Service with a malformed request got %s", ip)
	}

	// Fixed: served at once (the update triggers a sync).
	s, err := env.admin.CoreV1().Services("default").Get(context.Background(), "badann-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations[lb.AnnotationIP] = "10.88.0.61"
	if _, err := env.admin.CoreV1().Services("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := waitVIP(t, "badann-1", 30*time.Second); got != netip.MustParseAddr("10.88.0.61") {
		t.Fatalf("after the fix: %s, want 10.88.0.61", got)
	}
}

// Another host on the bridge already uses a pool address: the Service
// that asks for it gets an IPConflict event, and the CCM never answers
// for the address, so the other host keeps it.
func TestLoadBalancerIPConflict(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.70-10.88.0.72"), lbControllers)
	servicesGoneAtEnd(t, "conflict-")
	macs := lbNodes(t, "e2e-lbconf", 2)
	taken := netip.MustParseAddr("10.88.0.71")
	rogue := newLANClient(t, taken.String()+"/24")
	rogueMAC := rogue.mac(t)
	client := newLANClient(t, "10.88.0.8/24")
	arps := client.capture(t)

	svc := createLBService(t, "conflict-1", map[string]string{lb.AnnotationIP: taken.String()})
	msg := waitEvent(t, svc, v1.EventTypeWarning, provider.ReasonConflict, 30*time.Second)
	if !strings.Contains(msg, rogueMAC.String()) {
		t.Errorf("%s message %q does not name the owner %s", provider.ReasonConflict, msg, rogueMAC)
	}
	// Ask the bridge for the address over a window that spans the service
	// controller's next retry (5 s back-off): only the rogue may answer.
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		if err := arps.Request(taken); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // request pacing, not an assertion
	}
	answers := arps.AnswerMACs(taken, time.Time{})
	if len(answers) == 0 {
		t.Fatalf("nobody answered for %s; the rogue should", taken)
	}
	for _, m := range answers {
		if m != rogueMAC.String() {
			t.Errorf("%s answered by %s (node %q), want only the rogue %s", taken, m, nodeWithMAC(macs, mustMAC(m)), rogueMAC)
		}
	}
	if got := hostNeighbour(taken); got != nil {
		t.Errorf("host neighbour entry for the conflicting %s points at %s", taken, got)
	}
	if ip, ok := ingressIP(t, "conflict-1"); ok {
		t.Errorf("conflict-1 got %s in its status while another host owns it", ip)
	}
	if n := eventCount(t, svc, v1.EventTypeWarning, provider.ReasonConflict); n != 1 {
		t.Errorf("%d %s warnings, want 1 across retries:%s", n, provider.ReasonConflict, eventSummary(t, svc))
	}
}

func mustMAC(s string) net.HardwareAddr {
	m, _ := net.ParseMAC(s)
	return m
}

// The answering domain is destroyed: the VIP moves, and the LAN sees
// gratuitous ARP with the new node's MAC. Then that node turns NotReady:
// the VIP moves again.
func TestLoadBalancerFailoverGratuitousARP(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.75-10.88.0.76"), lbControllers)
	servicesGoneAtEnd(t, "garp-")
	macs := lbNodes(t, "e2e-lbgarp", 3)
	client := newLANClient(t, "10.88.0.9/24")
	arps := client.capture(t)

	createLBService(t, "garp-1", nil)
	vip, _ := waitVIP(t, "garp-1", 30*time.Second)
	first := waitNodeARP(t, client, vip, macs, 10*time.Second)

	moved := func(from, why string, cause func()) string {
		t.Helper()
		since := time.Now()
		cause()
		var to string
		var garp lanprobe.Frame
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			for n, m := range macs {
				if n == from {
					continue
				}
				if fs := arps.Announced(vip, m, since); len(fs) > 0 {
					to, garp = n, fs[0]
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("%s: no gratuitous ARP for %s with another node's MAC within 15s", why, vip)
		}
		t.Logf("%s: first gratuitous ARP for %s via %s (%s) %s after the cause", why, vip, to, garp.Op, garp.At.Sub(since).Round(time.Millisecond))
		// Both forms (request and reply) are sent; wait for the pair.
		err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			var ops []arp.Operation
			for _, f := range arps.Announced(vip, macs[to], since) {
				ops = append(ops, f.Op)
			}
			return slices.Contains(ops, arp.OperationRequest) && slices.Contains(ops, arp.OperationReply), nil
		})
		if err != nil {
			t.Errorf("%s: gratuitous ARP from %s not sent in both request and reply form", why, to)
		}
		if got := waitNodeARP(t, client, vip, macs, 10*time.Second); got != to {
			t.Fatalf("%s: ARP answered by %s, gratuitous ARP announced %s", why, got, to)
		}
		if got := hostNeighbour(vip); got.String() != macs[to].String() {
			t.Errorf("%s: host neighbour entry %v, want %s", why, got, macs[to])
		}
		return to
	}

	second := moved(first, "domain destroyed", func() {
		if err := domain(t, first).Destroy(); err != nil {
			t.Fatal(err)
		}
	})
	third := moved(second, "node NotReady", func() { setReady(t, second, v1.ConditionFalse) })
	if third == first {
		t.Fatalf("VIP moved back to %s, whose domain is shut off", first)
	}
}
