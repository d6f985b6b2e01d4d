package provider

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// answerFollowPeriod is how often a following replica compares its
// answers with the conditions with nothing changed: a missed watch event
// or a domain the cache had not seen yet costs no longer than that.
const answerFollowPeriod = 2 * time.Second

// hostDomains is what the follower needs of a hypervisor on its host.
// *libvirtcloud.Hypervisor satisfies it.
type hostDomains interface {
	follow.DomainEvents
	Domains() []libvirtcloud.Domain
	WaitSynced(ctx context.Context) error
}

// hostHypervisor is a hypervisor on this host and the bridge its guests
// answer on.
type hostHypervisor struct {
	domains hostDomains
	bridge  string
}

// follow starts answering on l's announcer, while this replica does not
// lead, for the VIPs that the Services' Announced conditions say nodes on
// this host answer (the leader writes them: answers_split.go; only the
// claims trustedAnswers believes count), from the Services (src, the
// replica's own informers, which the caller starts) and the domains of
// the hypervisors on this host, until the returned follower is halted.
func (l *loadBalancer) follow(ctx context.Context, src *announcedSource, here []hostHypervisor) (*follow.Follower, error) {
	changed := follow.NewKicker()
	services := src.services
	reg, err := follow.OnAnyChange(services.Informer(), changed.Kick)
	if err != nil {
		return nil, err
	}
	ctx, stopEvents := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, h := range here {
		follow.OnDomainEvents(ctx, &wg, h.domains, changed.Kick)
	}
	lister := services.Lister()
	report := newClaimReporter(src.recorder, src.grace)
	log := klog.FromContext(ctx).WithValues("bridge", l.bridge)
	prepare := func(ctx context.Context) bool {
		if !cache.WaitForCacheSync(ctx.Done(), src.synced...) {
			return false
		}
		for _, h := range here {
			if h.domains.WaitSynced(ctx) != nil {
				return false
			}
		}
		log.Info("Not leading: answering for the VIPs of nodes on this host, as the Services' conditions say")
		l.dropLeftVIPRoutes(log)
		return true
	}
	step := func(ctx context.Context) time.Duration {
		if all, err := lister.List(labels.Everything()); err == nil {
			local := macsOn(here)
			answers, refused := trustedAnswers(all, src.rules)
			// This host tells only of the claims it would have answered.
			refused = slices.DeleteFunc(refused, func(c refusedClaim) bool { return !isLocal(local, c.answer.MAC) })
			report.note(ctx, refused, time.Now())
			l.answerOnly(ctx, hostAnswers(answers, local))
		}
		return answerFollowPeriod
	}
	cleanup := func() {
		stopEvents()
		wg.Wait()
		_ = services.Informer().RemoveEventHandler(reg)
	}
	return follow.Start(ctx, changed, prepare, step, cleanup), nil
}

// dropLeftVIPRoutes removes the routes to VIPs this host's kernel holds.
// They are the leader's to keep, in its own host's kernel; any here are an
// earlier leader's, and would send this host's traffic to nodes that are
// gone. Without them the host reaches each VIP through its answer.
func (l *loadBalancer) dropLeftVIPRoutes(log klog.Logger) {
	r := l.place.vipRoutes
	if r == nil {
		return
	}
	if n, err := r.ReconcilePaths(nil); err != nil {
		log.Error(err, "Cannot remove the routes to VIPs an earlier leader left on this host")
	} else if n > 0 {
		log.Info("Removed the routes to VIPs an earlier leader left on this host", "routes", n)
	}
}

// answerOnly makes the announcer answer exactly want.
func (l *loadBalancer) answerOnly(ctx context.Context, want map[netip.Addr]net.HardwareAddr) {
	log := klog.FromContext(ctx)
	have := l.ann.Answering()
	for ip := range have {
		if _, ok := want[ip]; ok {
			continue
		}
		if err := l.ann.Remove(ip); err != nil {
			log.Error(err, "Cannot stop answering a VIP that no node on this host answers now", "ip", ip)
			continue
		}
		log.Info("Stopped answering a VIP: no node on this host answers it now", "ip", ip)
	}
	for ip, mac := range want {
		if bytes.Equal(have[ip], mac) {
			continue
		}
		if err := l.ann.SetAfter(ip, mac, time.Time{}); err != nil {
			log.Error(err, "Answering VIP for a node on this host", "ip", ip, "mac", mac)
			continue
		}
		log.Info("Answering VIP for a node on this host", "ip", ip, "mac", mac)
	}
}

// macsOn is the MACs the domains of here have on their bridges.
func macsOn(here []hostHypervisor) map[macKey]bool {
	out := map[macKey]bool{}
	for _, h := range here {
		for _, d := range h.domains.Domains() {
			if k, ok := keyOf(macOn(d, h.bridge)); ok {
				out[k] = true
			}
		}
	}
	return out
}

// hostAnswers is what this host answers of the answers the conditions
// claim (trustedAnswers): each VIP whose answering MAC is a NIC of a
// domain on this host (local).
func hostAnswers(answers map[netip.Addr]lb.Answer, local map[macKey]bool) map[netip.Addr]net.HardwareAddr {
	out := map[netip.Addr]net.HardwareAddr{}
	for vip, a := range answers {
		if isLocal(local, a.MAC) {
			out[vip] = a.MAC
		}
	}
	return out
}

// isLocal says whether mac is one of local.
func isLocal(local map[macKey]bool, mac net.HardwareAddr) bool {
	k, ok := keyOf(mac)
	return ok && local[k]
}
