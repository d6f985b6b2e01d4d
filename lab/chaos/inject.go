package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/lb"
)

// The injectors: each breaks one thing in the lab, and the matching
// recovery puts it back the way the lab made it. They run in the lab's
// namespace. inject returns when the fault is in place (the domain is
// down, the daemon gone); the returned undo puts it back, or is nil for a
// fault with nothing to undo (a Service created or deleted).

type injector struct {
	st     *lab.State
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
	case FaultHostLoss, FaultLeaderHostLoss:
		// The observer first: a frozen libvirtd would hang its reads.
		in.obs.hostLost(f.Host, time.Now())
		if err := lab.LoseHost(in.st, f.Host); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			err := lab.RestoreHost(ctx, in.st, f.Host)
			in.obs.hostBack(f.Host)
			return err
		}, nil
	case FaultServiceCreate:
		for _, s := range f.Create {
			if err := createService(ctx, in.client, s); err != nil {
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
	h, err := in.st.HostOfNode(name)
	if err != nil {
		return nil, err
	}
	c, err := libvirt.NewConnect(h.URI)
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
		pid, err := host.QEMUPid(name)
		if err != nil {
			return nil, err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return nil, fmt.Errorf("kill -9 QEMU of %s (pid %d): %w", name, pid, err)
		}
	} else {
		_ = d.Shutdown() // guests without ACPI handling ignore it
		if !host.WaitDomainDown(d, 5*time.Second) {
			if err := d.DestroyFlags(libvirt.DOMAIN_DESTROY_GRACEFUL); err != nil {
				return nil, fmt.Errorf("destroy %s: %w", name, err)
			}
		}
	}
	if !host.WaitDomainDown(d, 15*time.Second) {
		return nil, fmt.Errorf("domain %s still running after it was stopped", name)
	}
	in.obs.wentDown(name, time.Now())
	return func(context.Context) error { return host.StartDomain(h.URI, name) }, nil
}

// ccmKill SIGKILLs the CCM; the recovery starts it again with the command
// the lab started it with.
func (in *injector) ccmKill() (func(context.Context) error, error) {
	pid := in.st.Pids[lab.CCMProcess]
	if pid <= 0 || !host.IsProcess(pid, lab.CCMProcess) {
		// Restarted by someone else: the process running the lab's command.
		if pid = host.ProcessWithCommand(in.st.CCMCommand); pid == 0 {
			return nil, fmt.Errorf("the lab's CCM (pid %d in the state) is not running", in.st.Pids[lab.CCMProcess])
		}
	}
	if err := host.KillAndWait(pid, syscall.SIGKILL, 10*time.Second); err != nil {
		return nil, fmt.Errorf("CCM: %w", err)
	}
	return func(context.Context) error {
		in.obs.ccmStartedAt(time.Now())
		if err := in.st.LaunchCCM(); err != nil {
			return fmt.Errorf("restart the CCM: %w", err)
		}
		return in.st.Save()
	}, nil
}

// libvirtdStop ends libvirtd with sig (guests keep running); the recovery
// starts it again as the lab did.
func (in *injector) libvirtdStop(sig string) (func(context.Context) error, error) {
	pid := in.st.Pids["libvirtd"]
	if pid <= 0 || !host.IsProcess(pid, "libvirtd") {
		// Restarted by someone else (libvirtd -d): its pid file says which.
		data, err := os.ReadFile("/run/libvirtd.pid")
		if pid, _ = strconv.Atoi(strings.TrimSpace(string(data))); err != nil || pid <= 0 || !host.IsProcess(pid, "libvirtd") {
			return nil, fmt.Errorf("the lab's libvirtd (pid %d in the state) is not running", in.st.Pids["libvirtd"])
		}
	}
	s := syscall.SIGTERM
	if sig == "KILL" {
		s = syscall.SIGKILL
	}
	if err := host.KillAndWait(pid, s, 20*time.Second); err != nil {
		return nil, fmt.Errorf("libvirtd: %w", err)
	}
	return func(ctx context.Context) error {
		d := libvirtd.Detached(in.st.Dir)
		if err := d.StartLibvirtd(ctx); err != nil {
			return fmt.Errorf("restart libvirtd: %w", err)
		}
		in.st.Pids["libvirtd"] = d.LibvirtdPid()
		return in.st.Save()
	}, nil
}

// bridgeFlap sets the bridge's link down; the recovery sets it up.
func (in *injector) bridgeFlap() (func(context.Context) error, error) {
	link, err := netlink.LinkByName(lab.Bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", lab.Bridge, err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		return nil, fmt.Errorf("link down %s: %w", lab.Bridge, err)
	}
	return func(context.Context) error {
		link, err := netlink.LinkByName(lab.Bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", lab.Bridge, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("link up %s: %w", lab.Bridge, err)
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
	ports, err := host.Ports(lab.Bridge)
	if err != nil {
		return nil, err
	}
	c, err := libvirt.NewConnect(in.st.LibvirtURI())
	if err != nil {
		return nil, fmt.Errorf("libvirt: %w", err)
	}
	defer c.Close()
	n, err := c.LookupNetworkByName(lab.NetworkName)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", lab.NetworkName, err)
	}
	defer n.Free()
	if err := n.Destroy(); err != nil {
		return nil, fmt.Errorf("net-destroy %s: %w", lab.NetworkName, err)
	}
	return func(context.Context) error {
		if err := in.st.CreateNetwork(in.st.LabHosts()[0]); err != nil {
			return fmt.Errorf("create network %s again: %w", lab.NetworkName, err)
		}
		return host.Replug(lab.Bridge, ports)
	}, nil
}

// serviceLabel marks the Services chaos creates, so that it removes
// exactly those at the end.
const serviceLabel = "labcloud.io/chaos"

func createService(ctx context.Context, client kubernetes.Interface, s PlannedService) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: map[string]string{serviceLabel: "true"}},
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

// deleteServices removes every Service chaos created, in any run.
func deleteServices(ctx context.Context, client kubernetes.Interface) error {
	list, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: serviceLabel})
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
