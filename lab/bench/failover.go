package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/placement"
)

// Bounds of one failover run.
const (
	// moveBound: the libvirt event, the gratuitous ARP and the neighbour
	// entry are expected within milliseconds; past this they are missing.
	moveBound = 30 * time.Second
	// clientBound: the client's first answer (TCP retries, kube-proxy).
	clientBound = 2 * time.Minute
	// eligibleBound: a restarted guest boots and its kubelet reports.
	eligibleBound = 5 * time.Minute
	// probeEvery: the client opens a new connection this often.
	probeEvery = 100 * time.Millisecond
)

// failoverBench runs failovers of the node answering one VIP, watching the
// bridge, the hosts' neighbour tables and every host's libvirt events all
// along.
type failoverBench struct {
	client kubernetes.Interface
	st     *lab.State
	vip    string
	wire   *wireWatch
	events *domainWatch
	// started is when the bench last started each node: its Node must
	// report after that before the node counts as eligible.
	started map[string]time.Time
}

func newFailoverBench(ctx context.Context, client kubernetes.Interface, st *lab.State, vip string) (*failoverBench, error) {
	ip, err := parseVIP(vip)
	if err != nil {
		return nil, err
	}
	hosts := st.LabHosts()
	uris := make([]string, 0, len(hosts))
	var others []string // the namespaces of hosts but the first, where the bench runs
	for _, h := range hosts {
		uris = append(uris, h.URI)
		if h.Index > 1 {
			others = append(others, h.Netns)
		}
	}
	events, err := watchDomains(uris...)
	if err != nil {
		return nil, err
	}
	wire, err := watchWire(lab.Bridge, ip, others...)
	if err != nil {
		events.close()
		return nil, err
	}
	return &failoverBench{client: client, st: st, vip: vip, wire: wire, events: events, started: map[string]time.Time{}}, nil
}

func (b *failoverBench) close() {
	b.wire.Close()
	b.events.close()
}

// once runs one failover of the given kind. The error is one that makes
// further runs meaningless (a node that does not come back); a figure that
// was not seen is recorded in the run instead.
func (b *failoverBench) once(ctx context.Context, kind string) (FailoverRun, error) {
	run := FailoverRun{Kind: kind, VIP: b.vip}
	from, fromMAC, macs, err := b.waitEligible(ctx)
	if err != nil {
		return run, err
	}
	run.From = from
	onFrom := map[string]bool{}
	pods, err := b.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return run, err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == from {
			onFrom[p.Name] = true
		}
	}
	before, err := b.client.CoreV1().Nodes().Get(ctx, from, metav1.GetOptions{})
	if err != nil {
		return run, err
	}
	prober := startProber(b.vip, probeEvery)

	trigger := time.Now()
	switch kind {
	case FailoverCrash:
		pid, err := host.QEMUPid(from)
		if err != nil {
			prober.stop()
			return run, err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			prober.stop()
			return run, fmt.Errorf("kill QEMU of %s: %w", from, err)
		}
	case FailoverStop:
		if err := lab.NodeAction(b.st, from, "stop"); err != nil {
			prober.stop()
			return run, fmt.Errorf("stop %s: %w", from, err)
		}
	default:
		prober.stop()
		return run, fmt.Errorf("failover kind %q: want %s or %s", kind, FailoverCrash, FailoverStop)
	}
	// Only requests started once the node is down count: before, the
	// node's kube-proxy answered through pods elsewhere.
	down := time.Now()
	since := func(t time.Time) *float64 { s := t.Sub(trigger).Seconds(); return &s }
	missing := func(what string, err error) { run.Errors = append(run.Errors, fmt.Sprintf("%s: %v", what, err)) }

	mctx, cancel := context.WithTimeout(ctx, moveBound)
	event, err := b.events.wait(mctx, from, trigger)
	if err == nil {
		run.LibvirtEventSeconds = since(event)
	} else {
		missing("libvirt stopped event", err)
	}
	if g, err := b.wire.wait(mctx, func() (lanprobe.Frame, bool) { return b.wire.firstGARP(trigger, fromMAC) }); err == nil {
		run.GARPSeconds = since(g.At)
		run.ToNode = macs[g.MAC.String()]
		if run.LibvirtEventSeconds != nil {
			d := g.At.Sub(event).Seconds()
			run.GARPAfterEventSeconds = &d
		}
	} else {
		missing("gratuitous ARP on "+lab.Bridge, err)
	}
	if n, err := b.wire.wait(mctx, func() (lanprobe.Frame, bool) { return b.wire.firstNeighbour(trigger, fromMAC) }); err == nil {
		run.NeighbourSeconds = since(n.At)
	} else {
		missing("host neighbour entry", err)
	}
	cancel()
	cctx, cancel := context.WithDeadline(ctx, trigger.Add(clientBound))
	a, err := prober.wait(cctx, down, func(who string) bool { return strings.HasPrefix(who, app) && !onFrom[who] })
	cancel()
	prober.stop()
	if err == nil {
		run.Seconds, run.To = since(a.end), a.answer
	} else {
		missing("HTTP answer through the VIP", err)
	}

	// Back up, and eligible again: the next run starts from a whole lab.
	var restarted time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// libvirt may need a moment to notice a killed QEMU is gone.
		restarted = time.Now()
		if err = lab.NodeAction(b.st, from, "start"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return run, fmt.Errorf("start %s again: %w", from, err)
	}
	b.started[from] = restarted
	ready, err := b.waitReport(ctx, from, restarted, placement.ReadyReport(before))
	if err != nil {
		return run, err
	}
	eligible := ready.Sub(restarted).Seconds()
	run.EligibleAgainSeconds = &eligible
	return run, nil
}

// waitEligible waits until every node is eligible for VIPs (running, Ready
// as reported after the bench last started it), every bench pod is ready,
// and the VIP is answered over HTTP and by a node's MAC on the bridge. It
// returns that node, its MAC and every node by MAC.
func (b *failoverBench) waitEligible(ctx context.Context) (string, []byte, map[string]string, error) {
	var (
		why, node string
		mac       []byte
		macs      map[string]string
	)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, eligibleBound, true, func(context.Context) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		st, err := lab.GetStatus(ctx, b.st)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		macs = map[string]string{}
		why = ""
		for _, n := range st.Nodes {
			macs[n.MAC] = n.Name
			if n.DomainState != "running" || n.Ready != "True" {
				why = fmt.Sprintf("node %s: domain %s, Ready %s", n.Name, n.DomainState, n.Ready)
			}
		}
		for name, at := range b.started {
			n, err := b.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !reportedSince(n, at, "") {
				why = fmt.Sprintf("node %s has not reported Ready since its start at %s", name, at.Format(time.TimeOnly))
			}
		}
		if why != "" {
			return false, nil
		}
		if err := waitPods(ctx, b.client, len(b.st.Nodes)); err != nil {
			return false, err
		}
		if !strings.HasPrefix(answer(b.vip), app) {
			why = "the VIP does not answer over HTTP"
			return false, nil
		}
		for _, s := range st.Services {
			if s.VIP == b.vip && s.Node != "" {
				m, err := net.ParseMAC(s.MAC)
				if err == nil {
					node, mac = s.Node, m
					return true, nil
				}
			}
		}
		why = "no node's MAC answers the VIP on " + lab.Bridge
		return false, nil
	})
	if err != nil {
		if ctx.Err() == nil && wait.Interrupted(err) {
			err = fmt.Errorf("the lab is not whole within %s: %s", eligibleBound, why)
		}
		return "", nil, nil, err
	}
	return node, mac, macs, nil
}

// waitReport polls the Node until it reports Ready after start (and with a
// report other than before), and returns when that was first seen.
func (b *failoverBench) waitReport(ctx context.Context, name string, start time.Time, before string) (time.Time, error) {
	for deadline := start.Add(eligibleBound); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		n, err := b.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && reportedSince(n, start, before) {
			return time.Now(), nil
		}
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
	}
	return time.Time{}, fmt.Errorf("node %s did not report Ready within %s of its start", name, eligibleBound)
}

// reportedSince: the Node reports Ready with a heartbeat at or after since
// (heartbeats have whole seconds) in a report other than before.
func reportedSince(n *v1.Node, since time.Time, before string) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) &&
				placement.ReadyReport(n) != before
		}
	}
	return false
}

// describe is the run in one line.
func (r FailoverRun) describe() string {
	how := map[string]string{FailoverCrash: "QEMU killed", FailoverStop: "stopped (libvirt destroy)"}[r.Kind]
	f := func(p *float64) string {
		if p == nil {
			return "-"
		}
		if *p < 1 {
			return fmt.Sprintf("%.1fms", *p*1000)
		}
		return fmt.Sprintf("%.2fs", *p)
	}
	s := fmt.Sprintf("%s %s; libvirt event +%s, gratuitous ARP via %s +%s (%s after the event), neighbour entry +%s, HTTP answer from %s +%s; eligible again %s after its start",
		r.From, how, f(r.LibvirtEventSeconds), dashIfEmpty(r.ToNode), f(r.GARPSeconds), f(r.GARPAfterEventSeconds),
		f(r.NeighbourSeconds), dashIfEmpty(r.To), f(r.Seconds), f(r.EligibleAgainSeconds))
	if len(r.Errors) > 0 {
		s += "; not seen: " + strings.Join(r.Errors, "; ")
	}
	return s
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// summarizeFailovers computes the percentiles of each figure per kind.
func summarizeFailovers(runs []FailoverRun) map[string]FailoverSummary {
	type figures struct{ client, event, garp, afterEvent, neigh, eligible []float64 }
	by := map[string]*figures{}
	count := map[string]int{}
	add := func(xs *[]float64, p *float64) {
		if p != nil {
			*xs = append(*xs, *p)
		}
	}
	for _, r := range runs {
		f := by[r.Kind]
		if f == nil {
			f = &figures{}
			by[r.Kind] = f
		}
		count[r.Kind]++
		add(&f.client, r.Seconds)
		add(&f.event, r.LibvirtEventSeconds)
		add(&f.garp, r.GARPSeconds)
		add(&f.afterEvent, r.GARPAfterEventSeconds)
		add(&f.neigh, r.NeighbourSeconds)
		add(&f.eligible, r.EligibleAgainSeconds)
	}
	out := map[string]FailoverSummary{}
	for kind, f := range by {
		out[kind] = FailoverSummary{
			Runs: count[kind], Client: PercentilesOf(f.client), LibvirtEvent: PercentilesOf(f.event),
			GARP: PercentilesOf(f.garp), GARPAfterEvent: PercentilesOf(f.afterEvent),
			Neighbour: PercentilesOf(f.neigh), EligibleAgain: PercentilesOf(f.eligible),
		}
	}
	return out
}

// prober asks vip's /hostname on a new connection every period, each
// request with its own timeout, whatever the previous ones are doing: what
// a client retrying a dead address sees, without TCP's own backoff.
type prober struct {
	mu   sync.Mutex
	done []attempt
	quit chan struct{}
	wg   sync.WaitGroup
}

// attempt is one request: when it started and ended, and the answer (the
// body; empty when it failed).
type attempt struct {
	start, end time.Time
	answer     string
}

func startProber(vip string, every time.Duration) *prober {
	p := &prober{quit: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				a := attempt{start: time.Now()}
				a.answer = lanprobe.Hostname(vip, time.Second)
				a.end = time.Now()
				p.mu.Lock()
				p.done = append(p.done, a)
				p.mu.Unlock()
			}()
			select {
			case <-p.quit:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// wait returns the first successful attempt started at or after since whose
// answer ok accepts, once one has ended, or fails when ctx ends.
func (p *prober) wait(ctx context.Context, since time.Time, ok func(string) bool) (attempt, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		a, found := firstAnswer(p.done, since, ok)
		n := len(p.done)
		p.mu.Unlock()
		if found {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return attempt{}, fmt.Errorf("none of %d requests answered: %w", n, ctx.Err())
		case <-t.C:
		}
	}
}

// firstAnswer is the attempt that ended first among those started at or
// after since with an answer ok accepts.
func firstAnswer(as []attempt, since time.Time, ok func(string) bool) (attempt, bool) {
	var best attempt
	found := false
	for _, a := range as {
		if a.answer == "" || a.start.Before(since) || !ok(a.answer) {
			continue
		}
		if !found || a.end.Before(best.end) {
			best, found = a, true
		}
	}
	return best, found
}

// stop ends the prober and waits for its requests.
func (p *prober) stop() {
	close(p.quit)
	p.wg.Wait()
}

// domainWatch records libvirt's lifecycle events on its own connection,
// stamped on arrival.
type domainWatch struct {
	watches []lifecycleWatch // one per host's libvirtd
	mu      sync.Mutex
	seen    []domainEvent
}

type lifecycleWatch struct {
	conn *libvirt.Connect
	id   int
}

type domainEvent struct {
	name  string
	event libvirt.DomainEventType
	at    time.Time
}

// watchDomains records the lifecycle events of the domains of every
// libvirtd in uris (each host's).
func watchDomains(uris ...string) (*domainWatch, error) {
	if err := libvirtcloud.StartEventLoop(); err != nil {
		return nil, err
	}
	w := &domainWatch{}
	for _, uri := range uris {
		conn, err := libvirt.NewConnectReadOnly(uri)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("libvirt %s: %w", uri, err)
		}
		id, err := conn.DomainEventLifecycleRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventLifecycle) {
			at := time.Now()
			name, _ := d.GetName() // local: the event carries it
			w.mu.Lock()
			w.seen = append(w.seen, domainEvent{name: name, event: ev.Event, at: at})
			w.mu.Unlock()
		})
		if err != nil {
			conn.Close()
			w.close()
			return nil, fmt.Errorf("libvirt %s lifecycle events: %w", uri, err)
		}
		w.watches = append(w.watches, lifecycleWatch{conn: conn, id: id})
	}
	return w, nil
}

// wait returns when libvirt first reported the domain stopped or crashed
// at or after since.
func (w *domainWatch) wait(ctx context.Context, name string, since time.Time) (time.Time, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		w.mu.Lock()
		for _, e := range w.seen {
			if e.name == name && !e.at.Before(since) && (e.event == libvirt.DOMAIN_EVENT_STOPPED || e.event == libvirt.DOMAIN_EVENT_CRASHED) {
				w.mu.Unlock()
				return e.at, nil
			}
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-t.C:
		}
	}
}

func (w *domainWatch) close() {
	for _, l := range w.watches {
		_ = l.conn.DomainEventDeregister(l.id)
		l.conn.Close()
	}
}

func parseVIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ip, fmt.Errorf("bench VIP: %w", err)
	}
	return ip, nil
}
