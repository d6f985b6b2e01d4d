package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

var clientSeq atomic.Int32

// lanClient is a network namespace plugged into the e2e bridge, standing
// for another machine on the LAN that asks who has a VIP.
type lanClient struct {
	ns   netns.NsHandle
	name string
	ifc  string
}

func newLANClient(t testing.TB, addr string) *lanClient {
	t.Helper()
	n := clientSeq.Add(1)
	// Named per run: a run that was killed leaves its names behind.
	name := fmt.Sprintf("lce2e-%d-client%d", os.Getpid(), n)
	host, peer := fmt.Sprintf("lcc%dh", n), fmt.Sprintf("lcc%dp", n)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	run("ip", "link", "set", host, "master", env.bridge, "up")
	run("ip", "link", "set", peer, "netns", name)
	run("ip", "-n", name, "link", "set", "lo", "up")
	run("ip", "-n", name, "addr", "add", addr, "dev", peer)
	run("ip", "-n", name, "link", "set", peer, "up")
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return &lanClient{ns: ns, name: name, ifc: peer}
}

// resolve sends one ARP request for ip from the client and returns the
// answer's MAC, or nil if nobody answered within timeout.
func (c *lanClient) resolve(ip netip.Addr, timeout time.Duration) (net.HardwareAddr, error) {
	type result struct {
		mac net.HardwareAddr
		err error
	}
	done := make(chan result, 1)
	go func() {
		var cl *arp.Client
		err := c.inNetns(func() error {
			ifi, err := net.InterfaceByName(c.ifc)
			if err != nil {
				return err
			}
			cl, err = arp.Dial(ifi) // the socket stays in the client namespace
			return err
		})
		if err != nil {
			done <- result{err: err}
			return
		}
		defer cl.Close()
		_ = cl.SetDeadline(time.Now().Add(timeout))
		mac, err := cl.Resolve(ip)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = nil
			}
		}
		done <- result{mac: mac, err: err}
	}()
	r := <-done
	return r.mac, r.err
}

// waitARP polls until the client's ARP request for ip is answered with
// want (or, with want nil, until nobody answers).
func (c *lanClient) waitARP(t testing.TB, ip netip.Addr, want net.HardwareAddr, timeout time.Duration) {
	t.Helper()
	var last net.HardwareAddr
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		mac, err := c.resolve(ip, 300*time.Millisecond)
		if err != nil {
			return false, err
		}
		last = mac
		if want == nil {
			return mac == nil, nil
		}
		return mac.String() == want.String(), nil
	})
	if err != nil {
		t.Fatalf("ARP for %s from the LAN: answered by %v, want %v: %v", ip, last, want, err)
	}
}

// createLBService creates a LoadBalancer Service with the given annotations.
func createLBService(t testing.TB, name string, annotations map[string]string, ports ...int32) *v1.Service {
	t.Helper()
	if len(ports) == 0 {
		ports = []int32{80}
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: annotations},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP})
	}
	return createService(t, svc)
}

// createService creates svc in "default" and deletes it after the test.
func createService(t testing.TB, svc *v1.Service) *v1.Service {
	t.Helper()
	created, err := env.admin.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	return created
}

// waitVIP waits for the Service's first ingress IP.
func waitVIP(t testing.TB, name string, timeout time.Duration) (netip.Addr, *v1.Service) {
	t.Helper()
	var svc *v1.Service
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := env.admin.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		svc = s
		return len(s.Status.LoadBalancer.Ingress) > 0, nil
	})
	if err != nil {
		t.Fatalf("service %s got no VIP within %s", name, timeout)
	}
	return netip.MustParseAddr(svc.Status.LoadBalancer.Ingress[0].IP), svc
}

// lbCloudConfig is the e2e cloud config with load balancers on the bridge.
func lbCloudConfig(pool string) string {
	return libvirtCloudConfig() + fmt.Sprintf(`loadBalancer:
  bridge: %s
  pools: [{name: e2e, addresses: [%s]}]
`, env.bridge, pool)
}

// inNetns runs fn on a thread switched into the client namespace and
// switches the thread back before releasing it. A thread must never die
// while locked: the control plane, libvirtd and CCM processes are started
// with Pdeathsig, which the kernel ties to the thread that forked them, so
// a dying thread can take any of them down with it.
func (c *lanClient) inNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(c.ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", c.name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread is in the wrong namespace and must
			// not run anything else.
			errc <- fmt.Errorf("leave %s: %w", c.name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// mac is the MAC of the client's interface.
func (c *lanClient) mac(t testing.TB) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := c.inNetns(func() error {
		ifi, err := net.InterfaceByName(c.ifc)
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// arpFrame is one ARP packet the client saw, and when.
type arpFrame struct {
	at time.Time
	p  arp.Packet
}

// gratuitous reports whether f announces its sender IP (request or reply
// form) rather than asking or answering someone.
func (f arpFrame) gratuitous() bool { return f.p.SenderIP == f.p.TargetIP }

// arpCapture records every ARP packet reaching a LAN client, and sends
// requests from it: the client's view of the bridge.
type arpCapture struct {
	cl   *arp.Client
	self netip.Addr // the client's address, the target of answers to it

	mu      sync.Mutex
	answers map[netip.Addr][]arpFrame // answers to the client's requests, by sender IP
	garps   map[netip.Addr][]arpFrame // gratuitous frames, by announced IP
}

// capture opens a raw ARP socket in the client namespace and records what
// arrives until the test ends.
func (c *lanClient) capture(t testing.TB) *arpCapture {
	t.Helper()
	var (
		cl   *arp.Client
		self netip.Addr
	)
	if err := c.inNetns(func() error {
		ifi, err := net.InterfaceByName(c.ifc)
		if err != nil {
			return err
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !self.IsValid() {
				self = p.Addr()
			}
		}
		cl, err = arp.Dial(ifi) // asks from the same, first IPv4 address
		return err
	}); err != nil {
		t.Fatal(err)
	}
	a := &arpCapture{cl: cl, self: self, answers: map[netip.Addr][]arpFrame{}, garps: map[netip.Addr][]arpFrame{}}
	done := make(chan struct{})
	var closing atomic.Bool
	go func() {
		defer close(done)
		for {
			p, _, err := cl.Read()
			at := time.Now()
			if err != nil {
				if closing.Load() {
					return
				}
				continue // a frame that does not parse
			}
			f := arpFrame{at: at, p: *p}
			a.mu.Lock()
			switch {
			case f.gratuitous():
				a.garps[p.SenderIP] = append(a.garps[p.SenderIP], f)
			case p.Operation == arp.OperationReply && p.TargetIP == a.self:
				a.answers[p.SenderIP] = append(a.answers[p.SenderIP], f)
			}
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		closing.Store(true)
		_ = cl.SetReadDeadline(time.Now())
		<-done
		cl.Close()
	})
	return a
}

// request asks the bridge who has ip; answers are recorded.
func (a *arpCapture) request(ip netip.Addr) error { return a.cl.Request(ip) }

// answered returns the first answer to the client for ip seen at or after
// since.
func (a *arpCapture) answered(ip netip.Addr, since time.Time) (arpFrame, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range a.answers[ip] {
		if !f.at.Before(since) {
			return f, true
		}
	}
	return arpFrame{}, false
}

// answerMACs lists the distinct MACs that answered the client for ip.
func (a *arpCapture) answerMACs(ip netip.Addr) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, f := range a.answers[ip] {
		if m := f.p.SenderHardwareAddr.String(); !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// firstGratuitous returns the first gratuitous frame for ip from mac seen
// at or after since.
func (a *arpCapture) firstGratuitous(ip netip.Addr, mac net.HardwareAddr, since time.Time) (arpFrame, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range a.garps[ip] {
		if !f.at.Before(since) && f.p.SenderHardwareAddr.String() == mac.String() {
			return f, true
		}
	}
	return arpFrame{}, false
}

// gratuitousFrom returns every gratuitous frame for ip from mac since then.
func (a *arpCapture) gratuitousFrom(ip netip.Addr, mac net.HardwareAddr, since time.Time) []arpFrame {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []arpFrame
	for _, f := range a.garps[ip] {
		if !f.at.Before(since) && f.p.SenderHardwareAddr.String() == mac.String() {
			out = append(out, f)
		}
	}
	return out
}
