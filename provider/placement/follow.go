package placement

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// FollowPeriod is how often a following replica compares its
// answers with the conditions with nothing changed: a missed watch event
// or a domain the cache had not seen yet costs no longer than that.
const FollowPeriod = 2 * time.Second

// Claims are the answers the Services' Announced conditions claim, as
// far as this replica believes them: the leader writes the conditions
// (conditions.go), but anyone with write on services/status can, so the
// reader judges each claim. provider's reader of the conditions
// satisfies it.
type Claims interface {
	// OnChange calls f whenever the claims may have changed, until
	// remove is called.
	OnChange(f func()) (remove func(), err error)
	// WaitSynced waits until the claims can be read; false if ctx ends
	// first.
	WaitSynced(ctx context.Context) bool
	// Answers are, by VIP, the claims believed now that mine accepts;
	// the refused claims mine accepts are told of (each reader tells of
	// what it would have acted on). pending: some of those are not told
	// yet; look again soon.
	Answers(ctx context.Context, mine func(lb.Answer) bool) (answers map[netip.Addr]lb.Answer, pending bool, err error)
}

// HostDomains is what the follower needs of a hypervisor on its host.
// *libvirtcloud.Hypervisor satisfies it.
type HostDomains interface {
	follow.DomainEvents
	Domains() []libvirtcloud.Domain
	WaitSynced(ctx context.Context) error
}

var _ HostDomains = (*libvirtcloud.Hypervisor)(nil)

// HostHypervisor is a hypervisor on this host and the bridge its guests
// answer on.
type HostHypervisor struct {
	Domains HostDomains
	Bridge  string
}

// Follow starts answering, while this replica does not lead, for the VIPs
// that claims say nodes on this host answer (the leader writes them), from
// the domains of the hypervisors on this host (here), until Lead. A
// follower started after Lead answers nothing (answerer, answers.go).
func (p *Placement) Follow(ctx context.Context, claims Claims, here []HostHypervisor) error {
	changed := follow.NewKicker()
	remove, err := claims.OnChange(changed.Kick)
	if err != nil {
		return err
	}
	ctx, stopEvents := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, h := range here {
		follow.OnDomainEvents(ctx, &wg, h.Domains, changed.Kick)
	}
	log := klog.FromContext(ctx).WithValues("bridge", p.bridge)
	prepare := func(ctx context.Context) bool {
		if !claims.WaitSynced(ctx) {
			return false
		}
		for _, h := range here {
			if h.Domains.WaitSynced(ctx) != nil {
				return false
			}
		}
		return p.answers.follow(func() {
			log.Info("Not leading: answering for the VIPs of nodes on this host, as the Services' conditions say")
			p.dropLeftVIPRoutes(log)
		})
	}
	step := func(ctx context.Context) time.Duration {
		local := macsOn(here)
		// This host tells only of the claims it would have answered.
		answers, _, err := claims.Answers(ctx, func(a lb.Answer) bool { return isLocal(local, a.MAC) })
		if err == nil {
			p.answers.answerOnly(ctx, macsOf(answers))
		}
		return FollowPeriod
	}
	cleanup := func() {
		stopEvents()
		wg.Wait()
		remove()
	}
	p.follower = follow.Start(ctx, changed, prepare, step, cleanup)
	return nil
}

// dropLeftVIPRoutes removes the routes to VIPs this host's kernel holds.
// They are the leader's to keep, in its own host's kernel; any here are an
// earlier leader's, and would send this host's traffic to nodes that are
// gone. Without them the host reaches each VIP through its answer.
func (p *Placement) dropLeftVIPRoutes(log klog.Logger) {
	if p.vipRoutes == nil {
		return
	}
	if n, err := p.vipRoutes.ReconcilePaths(nil); err != nil {
		log.Error(err, "Cannot remove the routes to VIPs an earlier leader left on this host")
	} else if n > 0 {
		log.Info("Removed the routes to VIPs an earlier leader left on this host", "routes", n)
	}
}

// macsOn is the MACs the domains of here have on their bridges.
func macsOn(here []HostHypervisor) map[macKey]bool {
	out := map[macKey]bool{}
	for _, h := range here {
		for _, d := range h.Domains.Domains() {
			if k, ok := keyOf(macOn(d, h.Bridge)); ok {
				out[k] = true
			}
		}
	}
	return out
}

// macsOf is the MAC answering each VIP of answers.
func macsOf(answers map[netip.Addr]lb.Answer) map[netip.Addr]net.HardwareAddr {
	out := make(map[netip.Addr]net.HardwareAddr, len(answers))
	for vip, a := range answers {
		out[vip] = a.MAC
	}
	return out
}

// isLocal says whether mac is one of local.
func isLocal(local map[macKey]bool, mac net.HardwareAddr) bool {
	k, ok := keyOf(mac)
	return ok && local[k]
}
