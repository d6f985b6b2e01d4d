package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/lb"
)

// The injectors: each breaks one thing in the lab, and the matching
// recovery puts it back the way the lab made it. They run in the lab's
// namespace. inject returns when the fault is in place (the domain is
// down, the daemon gone); the returned undo puts it back, or is nil for a
// fault with nothing to undo (a Service created or deleted).

type injector struct {
	st     *State
	client kubernetes.Interface
	obs    *observer
}

func (in *injector) inject(ctx context.Context, f Fault) (undo func(context.Context) error, err error) {
	switch f.Kind {
	case FaultNodeStop:
		return in.nodeDown(f.Node, false)
	case FaultNodeKill:
		return in.nodeDown(f.Node, true)
	case FaultCCMKill:
		return in.ccmKill()
	case FaultLibvirtd:
		return in.libvirtdStop(f.Signal)
	case FaultBridgeFlap:
		return in.bridgeFlap()
	case FaultNetRecreate:
		return in.networkDestroy()
	case FaultServiceCreate:
		for _, s := range f.Create {
			if err := createChaosService(ctx, in.client, s); err != nil {
				return nil, err
			}
		}
		return nil, nil
	case FaultServiceDelete:
		err := in.client.CoreV1().Services(f.Delete.Namespace).Delete(ctx, f.Delete.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete Service %s: %w", f.Delete.Key(), err)
		}
		return nil, nil
	}
	return nil, fmt.Errorf("unknown fault kind %q", f.Kind)
}

// nodeDown stops a node's domain: gracefully (an ACPI shutdown, then
// libvirt's graceful destroy, SIGTERM to QEMU, when the guest ignores it),
// or by SIGKILL to its QEMU behind libvirt's back.
func (in *injector) nodeDown(name string, kill bool) (func(context.Context) error, error) {
	c, err := libvirt.NewConnect(libvirtURI(in.st))
	if err != nil {
		return nil, fmt.Errorf("libvirt: %w", err)
	}
	defer c.Close()
	d, err := c.LookupDomainByName(name)
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", name, err)
	}
	defer d.Free()
	if kill {
		pid, err := qemuPid(name)
		if err != nil {
			return nil, err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return nil, fmt.Errorf("kill -9 QEMU of %s (pid %d): %w", name, pid, err)
		}
	} else {
		_ = d.Shutdown() // guests without ACPI handling ignore it
		if !waitDomainDown(d, 5*time.Second) {
			if err := d.DestroyFlags(libvirt.DOMAIN_DESTROY_GRACEFUL); err != nil {
				return nil, fmt.Errorf("destroy %s: %w", name, err)
			}
		}
	}
	if !waitDomainDown(d, 15*time.Second) {
		return nil, fmt.Errorf("domain %s still running after it was stopped", name)
	}
	in.obs.wentDown(name, time.Now())
	return func(context.Context) error { return startDomain(libvirtURI(in.st), name) }, nil
}

func waitDomainDown(d *libvirt.Domain, timeout time.Duration) bool {
	return wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		active, err := d.IsActive()
		return err == nil && !active, nil
	}) == nil
}

func startDomain(uri, name string) error {
	c, err := libvirt.NewConnect(uri)
	if err != nil {
		return fmt.Errorf("libvirt: %w", err)
	}
	defer c.Close()
	d, err := c.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("domain %s: %w", name, err)
	}
	defer d.Free()
	if err := d.Create(); err != nil {
		return fmt.Errorf("start domain %s: %w", name, err)
	}
	return nil
}

// qemuPid finds the QEMU process of a lab guest from libvirt's pid file,
// checked against its command line.
func qemuPid(name string) (int, error) {
	data, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", name+".pid"))
	if err != nil {
		return 0, fmt.Errorf("QEMU pid of %s: %w", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("QEMU pid file of %s: %w", name, err)
	}
	if !argContains(cmdline(pid), "guest="+name) {
		return 0, fmt.Errorf("pid %d is not the QEMU of %s", pid, name)
	}
	return pid, nil
}

// ccmKill SIGKILLs the CCM; the recovery starts it again with the command
// the lab started it with.
func (in *injector) ccmKill() (func(context.Context) error, error) {
	pid := in.st.Pids[ccmPid]
	if pid <= 0 || !isProcess(pid, ccmPid) {
		// Restarted by someone else: the process running the lab's command.
		if pid = processWithCommand(in.st.CCMCommand); pid == 0 {
			return nil, fmt.Errorf("the lab's CCM (pid %d in the state) is not running", in.st.Pids[ccmPid])
		}
	}
	if err := killAndWait(pid, syscall.SIGKILL, 10*time.Second); err != nil {
		return nil, fmt.Errorf("CCM: %w", err)
	}
	return func(context.Context) error {
		if err := in.st.launchCCM(); err != nil {
			return fmt.Errorf("restart the CCM: %w", err)
		}
		return in.st.save()
	}, nil
}

// libvirtdStop ends libvirtd with sig (guests keep running); the recovery
// starts it again as the lab did.
func (in *injector) libvirtdStop(sig string) (func(context.Context) error, error) {
	pid := in.st.Pids["libvirtd"]
	if pid <= 0 || !isProcess(pid, "libvirtd") {
		// Restarted by someone else (libvirtd -d): its pid file says which.
		data, err := os.ReadFile("/run/libvirtd.pid")
		if pid, _ = strconv.Atoi(strings.TrimSpace(string(data))); err != nil || pid <= 0 || !isProcess(pid, "libvirtd") {
			return nil, fmt.Errorf("the lab's libvirtd (pid %d in the state) is not running", in.st.Pids["libvirtd"])
		}
	}
	s := syscall.SIGTERM
	if sig == "KILL" {
		s = syscall.SIGKILL
	}
	if err := killAndWait(pid, s, 20*time.Second); err != nil {
		return nil, fmt.Errorf("libvirtd: %w", err)
	}
	return func(ctx context.Context) error {
		d := libvirtd.Detached(in.st.Dir)
		if err := d.StartLibvirtd(ctx); err != nil {
			return fmt.Errorf("restart libvirtd: %w", err)
		}
		in.st.Pids["libvirtd"] = d.LibvirtdPid()
		return in.st.save()
	}, nil
}

// processWithCommand finds a process whose command line is cmd; 0 if none.
func processWithCommand(cmd []string) int {
	if len(cmd) == 0 {
		return 0
	}
	if pids := processes(func(args []string) bool { return slices.Equal(args, cmd) }); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// killAndWait sends sig to pid and waits until it has ended (SIGKILL
// after timeout).
func killAndWait(pid int, sig syscall.Signal, timeout time.Duration) error {
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal %d to pid %d: %w", sig, pid, err)
	}
	deadline := time.Now().Add(timeout)
	for syscall.Kill(pid, 0) == nil && !zombie(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// bridgeFlap sets the bridge's link down; the recovery sets it up.
func (in *injector) bridgeFlap() (func(context.Context) error, error) {
	link, err := netlink.LinkByName(Bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", Bridge, err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		return nil, fmt.Errorf("link down %s: %w", Bridge, err)
	}
	return func(context.Context) error {
		link, err := netlink.LinkByName(Bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", Bridge, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("link up %s: %w", Bridge, err)
		}
		return nil
	}, nil
}

// networkDestroy destroys the lab network (virsh net-destroy: the bridge
// and dnsmasq go). The lab's network is transient, so the recovery creates
// it again as up did, and puts the bridge's former ports (the guests' taps,
// LAN clients' veths) back on it, as an operator re-plugs after a network
// restart.
func (in *injector) networkDestroy() (func(context.Context) error, error) {
	ports, err := bridgePorts()
	if err != nil {
		return nil, err
	}
	c, err := libvirt.NewConnect(libvirtURI(in.st))
	if err != nil {
		return nil, fmt.Errorf("libvirt: %w", err)
	}
	defer c.Close()
	n, err := c.LookupNetworkByName(NetworkName)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", NetworkName, err)
	}
	defer n.Free()
	if err := n.Destroy(); err != nil {
		return nil, fmt.Errorf("net-destroy %s: %w", NetworkName, err)
	}
	return func(context.Context) error {
		if err := defineNetwork(); err != nil {
			return fmt.Errorf("create network %s again: %w", NetworkName, err)
		}
		return replug(ports)
	}, nil
}

// bridgePorts names the bridge's ports.
func bridgePorts() ([]string, error) {
	br, err := netlink.LinkByName(Bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", Bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// replug makes ports (those that still exist) ports of the bridge again.
func replug(ports []string) error {
	br, err := netlink.LinkByName(Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", Bridge, err)
	}
	for _, p := range ports {
		l, err := netlink.LinkByName(p)
		if err != nil {
			continue // gone with its guest
		}
		if l.Attrs().MasterIndex == br.Attrs().Index {
			continue // libvirt attached it already
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", p, Bridge, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("link up %s: %w", p, err)
		}
	}
	return nil
}

// chaosServiceLabel marks the Services chaos creates, so that it removes
// exactly those at the end.
const chaosServiceLabel = "labcloud.io/chaos"

func createChaosService(ctx context.Context, client kubernetes.Interface, s ChaosService) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: map[string]string{chaosServiceLabel: "true"}},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": s.Name},
			Ports:    []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: s.Port, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if s.SharingKey != "" {
		svc.Annotations = map[string]string{lb.AnnotationSharingKey: s.SharingKey}
	}
	if _, err := client.CoreV1().Services(s.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s: %w", s.Key(), err)
	}
	return nil
}

// deleteChaosServices removes every Service chaos created, in any run.
func deleteChaosServices(ctx context.Context, client kubernetes.Interface) error {
	list, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: chaosServiceLabel})
	if err != nil {
		return fmt.Errorf("list chaos Services: %w", err)
	}
	for _, s := range list.Items {
		if err := client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete Service %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

func ensureNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}
