package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/lanprobe"
)

// readyTracker times Services from creation to "done": an ingress IP in
// the status, and that IP answered by a node's MAC when a LAN client asks
// the bridge for it.
type readyTracker struct {
	arps  *lanprobe.Capture
	macs  map[string]net.HardwareAddr
	ctx   context.Context
	stopC func()

	mu      sync.Mutex
	created map[string]time.Time
	seen    map[string]bool
	done    map[string]time.Duration
	ips     map[string]netip.Addr
	want    int
	all     chan struct{}
}

// trackReady watches Services whose name starts with prefix.
func trackReady(b *testing.B, prefix string, arps *lanprobe.Capture, macs map[string]net.HardwareAddr) *readyTracker {
	ctx, cancel := context.WithCancel(context.Background())
	r := &readyTracker{arps: arps, macs: macs, ctx: ctx, stopC: cancel}
	r.reset(0)
	observe := func(obj any) {
		s, ok := obj.(*v1.Service)
		if !ok || !strings.HasPrefix(s.Name, prefix) || len(s.Status.LoadBalancer.Ingress) == 0 {
			return
		}
		ip, err := netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		if err != nil {
			return
		}
		r.mu.Lock()
		start, ok := r.created[s.Name]
		if !ok || r.seen[s.Name] {
			r.mu.Unlock()
			return
		}
		r.seen[s.Name] = true
		r.mu.Unlock()
		go r.waitAnswer(s.Name, ip, start)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(env.admin, 0, informers.WithNamespace("default"))
	inf := factory.Core().V1().Services().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	b.Cleanup(func() { cancel(); factory.Shutdown() })
	return r
}

// reset starts a new round expecting want Services.
func (r *readyTracker) reset(want int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created, r.seen, r.done, r.ips = map[string]time.Time{}, map[string]bool{}, map[string]time.Duration{}, map[string]netip.Addr{}
	r.want, r.all = want, make(chan struct{})
}

// waitAnswer asks the bridge for ip (again every 50 ms) until a node's MAC
// answers; the Service is done at the later of that answer and now (the
// status was just seen).
func (r *readyTracker) waitAnswer(name string, ip netip.Addr, start time.Time) {
	statusAt := time.Now()
	for r.ctx.Err() == nil {
		asked := time.Now()
		_ = r.arps.Request(ip)
		for time.Since(asked) < 50*time.Millisecond {
			if f, ok := r.arps.Answered(ip, start); ok && nodeWithMAC(r.macs, f.MAC) != "" {
				at := f.At
				if at.Before(statusAt) {
					at = statusAt
				}
				r.finish(name, ip, at.Sub(start))
				return
			}
			time.Sleep(time.Millisecond) // polling the capture, not an assertion
		}
	}
}

func (r *readyTracker) finish(name string, ip netip.Addr, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.done[name]; dup {
		return
	}
	r.done[name], r.ips[name] = d, ip
	if len(r.done) == r.want {
		close(r.all)
	}
}

func (r *readyTracker) create(b *testing.B, name string) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	r.mu.Lock()
	r.created[name] = time.Now()
	r.mu.Unlock()
	if _, err := env.admin.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		b.Errorf("create %s: %v", name, err)
	}
}

func (r *readyTracker) wait(b *testing.B, timeout time.Duration) {
	r.mu.Lock()
	all := r.all
	r.mu.Unlock()
	select {
	case <-all:
	case <-time.After(timeout):
		r.mu.Lock()
		defer r.mu.Unlock()
		b.Fatalf("%d of %d Services done after %s (%d with a status IP)", len(r.done), r.want, timeout, len(r.seen))
	}
}

func (r *readyTracker) durations() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]time.Duration, 0, len(r.done))
	for _, d := range r.done {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

func (r *readyTracker) distinctIPs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := map[netip.Addr]bool{}
	for _, ip := range r.ips {
		set[ip] = true
	}
	return len(set)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// deleteServicesAndWait deletes the Services named prefix* and waits until
// the CCM has released them (finalizers gone).
func deleteServicesAndWait(b *testing.B, prefix string, timeout time.Duration) {
	ctx := context.Background()
	list, err := env.admin.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	names := make(chan string)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range names {
				_ = env.admin.CoreV1().Services("default").Delete(ctx, n, metav1.DeleteOptions{})
			}
		}()
	}
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Name, prefix) {
			names <- list.Items[i].Name
		}
	}
	close(names)
	wg.Wait()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := env.admin.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range list.Items {
			if strings.HasPrefix(list.Items[i].Name, prefix) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatalf("Services %s* not released within %s", prefix, timeout)
	}
}

// bridgeSubnet adds a second subnet to the e2e bridge for the test, so that
// a large pool's VIPs are on-link for LAN clients.
func bridgeSubnet(b testing.TB, cidr string) {
	if out, err := exec.Command("ip", "addr", "add", cidr, "dev", env.bridge).CombinedOutput(); err != nil {
		b.Fatalf("ip addr add %s dev %s: %v: %s", cidr, env.bridge, err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "addr", "del", cidr, "dev", env.bridge).Run() })
}

// BenchmarkLBServiceReady: Service created → status.loadBalancer.ingress
// set and the VIP answered on the bridge (ARP from a LAN client), with the
// CCM's flags as shipped, two running QEMU domains as nodes, and the
// conflict probe on every new VIP. 1 Service (sequential samples), 100 and
// 1000 created at once by 32 clients; the CCM's peak RSS after 1000, with
// its idle RSS (mostly the binary's pages) and its peak anonymous RSS.
// The 1000 VIPs come from a second subnet added to the bridge, where the
// LAN client also has its address.
func BenchmarkLBServiceReady(b *testing.B) {
	requireEnv(b)
	bridgeSubnet(b, "10.89.0.1/20")
	ccm := startCCM(b, lbCloudConfig("10.89.4.0/22"), lbControllers)
	servicesGoneAtEnd(b, "lbb-")
	macs := lbNodes(b, "bench-lb", 2)
	client := newLANClient(b, "10.89.0.5/20")
	arps := client.capture(b)
	tr := trackReady(b, "lbb-", arps, macs)
	idleRSS, _ := ccm.proc.PeakRSS()
	mem := sampleMem(b, ccm.proc.Pid())

	b.Run("1svc", func(b *testing.B) {
		const samples = 20
		var ds []time.Duration
		for i := range samples {
			name := fmt.Sprintf("lbb-one-%02d", i)
			tr.reset(1)
			tr.create(b, name)
			tr.wait(b, 30*time.Second)
			ds = append(ds, tr.durations()...)
			deleteServicesAndWait(b, name, 60*time.Second)
		}
		slices.Sort(ds)
		b.ReportMetric(ms(ds[len(ds)/2]), "p50-ms")
		b.ReportMetric(ms(ds[len(ds)*9/10]), "p90-ms")
		b.ReportMetric(ms(ds[len(ds)-1]), "max-ms")
	})
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("%dsvcs", n), func(b *testing.B) {
			prefix := fmt.Sprintf("lbb-%d-", n)
			tr.reset(n)
			start := time.Now()
			createAll(n, func(i int) { tr.create(b, fmt.Sprintf("%s%04d", prefix, i)) })
			created := time.Since(start)
			tr.wait(b, 120*time.Second)
			all := time.Since(start)
			ds := tr.durations()
			b.ReportMetric(all.Seconds(), "all-done-s")
			// How long the API server took to accept the creations: the
			// floor under all-done-s on this host.
			b.ReportMetric(created.Seconds(), "created-s")
			b.ReportMetric(ms(ds[len(ds)/2]), "p50-ms")
			b.ReportMetric(ms(ds[len(ds)*99/100]), "p99-ms")
			if got := tr.distinctIPs(); got != n {
				b.Errorf("%d Services got %d distinct VIPs", n, got)
			}
			if n == 1000 {
				if rss, err := ccm.proc.PeakRSS(); err == nil {
					b.ReportMetric(float64(rss)/(1<<20), "ccm-peak-rss-MB")
				} else {
					b.Error(err)
				}
				// Before any Service: mostly the pages of the binary.
				b.ReportMetric(float64(idleRSS)/(1<<20), "ccm-idle-rss-MB")
				// What the CCM allocated itself, without its code.
				b.ReportMetric(mib(mem.peaks().anon), "ccm-peak-anon-rss-MB")
			}
			deleteServicesAndWait(b, prefix, 3*time.Minute)
		})
	}
}

var libvirtEventsOnce sync.Once

// lifecycleEvents opens a libvirt connection of the test's own that
// reports domain lifecycle events. The default event loop must exist
// before a connection that wants events is opened; env.virt predates it
// and keeps working without it.
func lifecycleEvents(b testing.TB) (<-chan domainEvent, func()) {
	var err error
	libvirtEventsOnce.Do(func() {
		if err = libvirt.EventRegisterDefaultImpl(); err != nil {
			return
		}
		go func() {
			for libvirt.EventRunDefaultImpl() == nil {
			}
		}()
	})
	if err != nil {
		b.Fatalf("libvirt event loop: %v", err)
	}
	conn, err := libvirt.NewConnect("qemu:///system")
	if err != nil {
		b.Fatal(err)
	}
	ch := make(chan domainEvent, 64)
	id, err := conn.DomainEventLifecycleRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventLifecycle) {
		at := time.Now()
		name, _ := d.GetName()
		select {
		case ch <- domainEvent{name: name, event: ev.Event, at: at}:
		default:
		}
	})
	if err != nil {
		conn.Close()
		b.Fatal(err)
	}
	return ch, func() {
		_ = conn.DomainEventDeregister(id)
		conn.Close()
	}
}

type domainEvent struct {
	name  string
	event libvirt.DomainEventType
	at    time.Time
}

// waitDomainEvent returns the time of the next event of this type for the
// named domain.
func waitDomainEvent(b testing.TB, ch <-chan domainEvent, name string, typ libvirt.DomainEventType) time.Time {
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-ch:
			if e.name == name && e.event == typ {
				return e.at
			}
		case <-deadline:
			b.Fatalf("no libvirt event %v for %s within 30s", typ, name)
		}
	}
}

// BenchmarkLBFailoverGratuitousARP: the answering domain is destroyed; time
// from the libvirt lifecycle event (seen on the test's own connection) to
// the first gratuitous ARP with the other node's MAC seen by a LAN client.
// The domain is started again and the next sample destroys the other one.
func BenchmarkLBFailoverGratuitousARP(b *testing.B) {
	r := newFailoverRig(b, "lbf")
	fromEvent, fromDestroy := r.failovers(b, 6, destroy)
	slices.Sort(fromEvent)
	slices.Sort(fromDestroy)
	b.ReportMetric(ms(fromEvent[len(fromEvent)/2]), "event-to-garp-p50-ms")
	b.ReportMetric(ms(fromEvent[len(fromEvent)-1]), "event-to-garp-max-ms")
	b.ReportMetric(ms(fromDestroy[len(fromDestroy)/2]), "destroy-to-garp-p50-ms")
	b.Logf("event → first gratuitous ARP: %v", fromEvent)
}

// failoverRig is a CCM over two running domains with Ready Nodes, one
// LoadBalancer Service's VIP, a LAN client capturing ARP on the bridge and
// the test's own libvirt lifecycle events.
type failoverRig struct {
	ccm    *ccm
	events <-chan domainEvent
	client *lanClient
	arps   *lanprobe.Capture
	vip    netip.Addr
	macs   map[string]net.HardwareAddr
}

// newFailoverRig makes a rig whose Service and domains are named after
// prefix.
func newFailoverRig(tb testing.TB, prefix string) *failoverRig {
	requireEnv(tb)
	events, closeEvents := lifecycleEvents(tb)
	tb.Cleanup(closeEvents)
	r := &failoverRig{events: events}
	r.ccm = startCCM(tb, lbCloudConfig("10.88.0.80-10.88.0.84"), lbControllers)
	servicesGoneAtEnd(tb, prefix+"-")
	r.macs = lbNodes(tb, "e2e-"+prefix, 2)
	r.client = newLANClient(tb, "10.88.0.10/24")
	r.arps = r.client.capture(tb)
	createLBService(tb, prefix+"-1", nil)
	r.vip, _ = waitVIP(tb, prefix+"-1", 30*time.Second)
	return r
}

func (r *failoverRig) failovers(tb testing.TB, n int, stop func(testing.TB, string)) (fromEvent, fromStop []time.Duration) {
	return failovers(tb, r.events, r.client, r.arps, r.vip, r.macs, n, stop)
}

// failovers stops the domain answering vip n times with stop, each time
// timing the first gratuitous ARP naming the other node from the libvirt
// event (the CCM's reaction to libvirt) and from the stop; the domain is
// started and Ready again before the next.
func failovers(b testing.TB, events <-chan domainEvent, client *lanClient, arps *lanprobe.Capture, vip netip.Addr, macs map[string]net.HardwareAddr, n int, stop func(testing.TB, string)) (fromEvent, fromDestroy []time.Duration) {
	b.Helper()
	for range n {
		// The node started last wins back the VIPs its hash wins once it
		// reports: let that move happen before timing the next.
		time.Sleep(time.Second)
		answering := waitNodeARP(b, client, vip, macs, 15*time.Second)
		other := otherNode(macs, answering)
		since := time.Now()
		stop(b, answering)
		dom := domain(b, answering)
		stopped := waitDomainEvent(b, events, answering, libvirt.DOMAIN_EVENT_STOPPED)
		var garp lanprobe.Frame
		err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			fs := arps.Announced(vip, macs[other], since)
			if len(fs) > 0 {
				garp = fs[0]
			}
			return len(fs) > 0, nil
		})
		if err != nil {
			b.Fatalf("no gratuitous ARP for %s via %s within 15s of destroying %s", vip, other, answering)
		}
		fromEvent = append(fromEvent, garp.At.Sub(stopped)) // negative: before libvirt's event
		fromDestroy = append(fromDestroy, garp.At.Sub(since))
		// Bring the domain back for the next sample; its "kubelet" reports
		// once the guest is up, which makes it a candidate again.
		if err := dom.Create(); err != nil {
			b.Fatal(err)
		}
		waitDomainEvent(b, events, answering, libvirt.DOMAIN_EVENT_STARTED)
		// A heartbeat has whole seconds: one in the second the domain went
		// down would not count as a report since, and the node would wait
		// for the next heartbeat to be eligible again.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		setReady(b, answering, v1.ConditionTrue)
	}
	return fromEvent, fromDestroy
}

// destroy stops a domain through libvirt (virsh destroy).
func destroy(t testing.TB, name string) {
	t.Helper()
	if err := domain(t, name).Destroy(); err != nil {
		t.Fatal(err)
	}
}

// killQEMU kills a domain's QEMU with SIGKILL, as a crash or the OOM
// killer would: the kernel deletes its tap at once, libvirt reports the
// domain stopped once it has reaped and cleaned up after it.
func killQEMU(t testing.TB, name string) {
	t.Helper()
	pid := qemuPid(t, name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill QEMU of %s (pid %d): %v", name, pid, err)
	}
}

// qemuPid is the pid of the QEMU running the domain.
func qemuPid(t testing.TB, name string) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("guest="+name+",")) || !bytes.Contains(b, []byte("qemu-system")) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			return pid
		}
	}
	t.Fatalf("no QEMU process runs domain %s", name)
	return 0
}

// BenchmarkLBFailoverQEMUKilled: the answering domain's QEMU is killed;
// times from the kill to the first gratuitous ARP naming the other node
// (the CCM reacts to the tap's deletion) and from libvirt's stopped event
// to it (negative when the CCM moved the VIP before libvirt said anything).
func BenchmarkLBFailoverQEMUKilled(b *testing.B) {
	r := newFailoverRig(b, "lbk")
	fromEvent, fromKill := r.failovers(b, 20, killQEMU)
	slices.Sort(fromEvent)
	slices.Sort(fromKill)
	b.ReportMetric(ms(fromKill[len(fromKill)/2]), "kill-to-garp-p50-ms")
	b.ReportMetric(ms(fromKill[len(fromKill)*99/100]), "kill-to-garp-p99-ms")
	b.ReportMetric(ms(fromEvent[len(fromEvent)/2]), "event-to-garp-p50-ms")
	b.Logf("kill → first gratuitous ARP: %v", fromKill)
}
