package provider

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// excludeLabel keeps a node out of load balancer pools, as upstream does.
const excludeLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// failoverResync re-checks every VIP's answering node even without events.
const failoverResync = 30 * time.Second

// candidates are the nodes that may answer for a VIP: their domain is
// running, has a NIC on the bridge, and the Node has reported since the
// domain was last seen down — until then the guest is still booting and its
// Ready condition is the one from before. The map gives that NIC's MAC.
func (l *loadBalancer) candidates(ctx context.Context, nodes []*v1.Node) map[string]net.HardwareAddr {
	out := make(map[string]net.HardwareAddr, len(nodes))
	for _, n := range nodes {
		d, _, err := l.instances.find(ctx, n)
		if err != nil || d.State != libvirtcloud.StateRunning || lastReport(n).Before(d.LastDown.Truncate(time.Second)) {
			continue
		}
		for _, i := range d.Interfaces {
			if i.Bridge != l.bridge {
				continue
			}
			if mac, err := net.ParseMAC(i.MAC); err == nil {
				out[n.Name] = mac
				break
			}
		}
	}
	return out
}

// eligible narrows candidates by the policies of the Services sharing the
// VIP: with externalTrafficPolicy Local, only nodes with a ready endpoint.
// svc, if given, is used instead of the lister's (possibly older) copy.
func (l *loadBalancer) eligible(holders []string, cands map[string]net.HardwareAddr, svc *v1.Service) map[string]net.HardwareAddr {
	out := cands
	for _, k := range holders {
		s := l.lookupService(k, svc)
		if s == nil || s.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
			continue
		}
		withEndpoints := l.endpointNodes(s)
		narrowed := map[string]net.HardwareAddr{}
		for name, mac := range out {
			if withEndpoints[name] {
				narrowed[name] = mac
			}
		}
		out = narrowed
	}
	return out
}

func (l *loadBalancer) lookupService(k string, given *v1.Service) *v1.Service {
	if given != nil && key(given) == k {
		return given
	}
	if l.services == nil {
		return nil
	}
	ns, name := splitKey(k)
	s, err := l.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return s
}

// endpointNodes are the nodes holding a ready endpoint of svc.
func (l *loadBalancer) endpointNodes(svc *v1.Service) map[string]bool {
	out := map[string]bool{}
	if l.slices == nil {
		return out
	}
	slices, err := l.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	if err != nil {
		return out
	}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				out[*ep.NodeName] = true
			}
		}
	}
	return out
}

// announce makes one eligible node answer for ip, after probing the bridge
// once for another owner of the address.
func (l *loadBalancer) announce(ctx context.Context, svc *v1.Service, ip netip.Addr, cands map[string]net.HardwareAddr) error {
	st := l.hold(ip, key(svc))
	l.mu.Lock()
	probed := st.probed
	l.mu.Unlock()
	if !probed {
		owner, taken, err := l.ann.Probe(ctx, ip)
		if err != nil {
			return fmt.Errorf("probe %s on %s: %w", ip, l.bridge, err)
		}
		if taken && !knownMAC(cands, owner) {
			err := fmt.Errorf("%s is already answered on %s by %s: not announcing it", ip, l.bridge, owner)
			l.warnOnce(svc, ReasonConflict, err)
			return err
		}
		l.mu.Lock()
		st.probed = true
		l.mu.Unlock()
	}
	return l.place(ctx, ip, cands, svc)
}

func knownMAC(cands map[string]net.HardwareAddr, mac net.HardwareAddr) bool {
	for _, m := range cands {
		if bytes.Equal(m, mac) {
			return true
		}
	}
	return false
}

// place chooses ip's answering node among cands (kept while it stays
// eligible, else the least loaded) and tells the announcer.
func (l *loadBalancer) place(ctx context.Context, ip netip.Addr, cands map[string]net.HardwareAddr, svc *v1.Service) error {
	l.mu.Lock()
	st := l.vips[ip]
	if st == nil {
		l.mu.Unlock()
		return nil // released meanwhile
	}
	holders := make([]string, 0, len(st.holders))
	for k := range st.holders {
		holders = append(holders, k)
	}
	prev := st.node
	l.mu.Unlock()

	elig := l.eligible(holders, cands, svc)
	names := make([]string, 0, len(elig))
	for n := range elig {
		names = append(names, n)
	}

	l.mu.Lock()
	load := map[string]int{}
	for other, s := range l.vips {
		if other != ip && s.node != "" {
			load[s.node]++
		}
	}
	chosen := lb.ChooseAnnouncer(ip.String(), st.node, names, load)
	mac := elig[chosen]
	changed := chosen != st.node || !bytes.Equal(mac, st.mac)
	st.node, st.mac = chosen, mac
	l.mu.Unlock()

	if chosen == "" {
		if err := l.ann.Remove(ip); err != nil {
			return fmt.Errorf("stop announcing %s: %w", ip, err)
		}
		if prev != "" || svc != nil {
			l.eventHolders(holders, svc, v1.EventTypeWarning, ReasonNoNode, "No eligible node (running domain on %s, Ready, with endpoints for Local policy) can answer for %s", l.bridge, ip)
		}
		return nil
	}
	if err := l.ann.Set(ip, mac); err != nil {
		return fmt.Errorf("announce %s via %s: %w", ip, chosen, err)
	}
	if !changed {
		return nil
	}
	if prev == "" {
		l.eventHolders(holders, svc, v1.EventTypeNormal, ReasonAnnounced, "%s announced via node %s (%s)", ip, chosen, mac)
	} else {
		klog.FromContext(ctx).Info("VIP moved", "ip", ip, "from", prev, "to", chosen, "mac", mac)
		l.eventHolders(holders, svc, v1.EventTypeNormal, ReasonMoved, "%s moved from node %s to node %s (%s)", ip, prev, chosen, mac)
	}
	return nil
}

func (l *loadBalancer) eventHolders(holders []string, given *v1.Service, typ, reason, format string, args ...any) {
	for _, k := range holders {
		if s := l.lookupService(k, given); s != nil {
			l.recorder.Eventf(s, typ, reason, format, args...)
		}
	}
}

// poke asks the failover loop for a pass; pokes coalesce.
func (l *loadBalancer) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// failover re-places every VIP whenever a domain changes state, a Node or
// an EndpointSlice changes, and periodically. The service controller does
// not call UpdateLoadBalancer on readiness changes: this loop is what moves
// a VIP off a node that died.
func (l *loadBalancer) failover(ctx context.Context) {
	for _, src := range l.events {
		ch, stop := src.Subscribe()
		go func() {
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-ch:
					if !ok {
						return
					}
					l.poke()
				}
			}
		}()
	}
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return
	}
	ticker := time.NewTicker(failoverResync)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-ticker.C:
		}
		l.replaceAll(ctx)
	}
}

func (l *loadBalancer) replaceAll(ctx context.Context) {
	all, err := l.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	var ready []*v1.Node
	for _, n := range all {
		if _, excluded := n.Labels[excludeLabel]; !excluded && n.DeletionTimestamp == nil && nodeReady(n) {
			ready = append(ready, n)
		}
	}
	cands := l.candidates(ctx, ready)
	l.mu.Lock()
	ips := make([]netip.Addr, 0, len(l.vips))
	for ip, st := range l.vips {
		if st.probed { // not yet announced ones belong to EnsureLoadBalancer
			ips = append(ips, ip)
		}
	}
	l.mu.Unlock()
	for _, ip := range ips {
		if err := l.place(ctx, ip, cands, nil); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot place VIP", "ip", ip)
		}
	}
}

// lastReport is the Node's last Ready heartbeat.
func lastReport(n *v1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func splitKey(k string) (string, string) {
	ns, name, _ := strings.Cut(k, "/")
	return ns, name
}
