package provider

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider/internal/follow"
	"github.com/labcloud/labcloud/provider/placement"
)

// A Service's Announced condition says which node answers each of its
// VIPs. The leader's placement writes it; so can anyone with write on
// services/status (another controller, or one tenant's admin where
// tenants may write their own Services' status). The replicas that act
// on the conditions (a follower's answers, placement.Follow, and the
// routed mode's BGP routes, bgp.go) believe a claim only when the leader
// could have made it: trustedAnswers is the one judge of what a condition
// may claim, and a claimReporter tells the Service what was refused. Each
// reads through a claimReader of its own.

// EventClaimRefused: a Service's Announced condition claims a VIP it may
// not (or that another Service claims for another node); this host does
// not act on the claim.
const EventClaimRefused = "AnnouncedClaimRefused"

// claimGrace is how long a claim must stay refused before its Service is
// told: every change passes through refused claims for a moment (a new
// Service's condition can land before its ingress, a released one's
// ingress goes before its condition, Services sharing a VIP get its new
// answer one patch apart), and the cache may lag the leader's writes by as
// much as its own writes (placement.CacheLag).
const claimGrace = placement.CacheLag

// announcedSource is where a replica reads the conditions from: its own
// informers (which the caller starts) and the rules a claim must meet.
type announcedSource struct {
	services coreinformers.ServiceInformer
	rules    claimRules
	synced   []cache.InformerSynced // the Services', and the Namespaces' if read
	recorder record.EventRecorder   // for the Services' Events
	grace    time.Duration          // claimGrace
}

// claimRules are the facts, besides the Services, that judge a claim.
type claimRules struct {
	serves func(*v1.Service) bool // whether a Service is this CCM's (its class)
	pools  *lb.Pools
	// namespaces gives a namespace's labels, for pools with a
	// namespaceSelector; nil when no pool has one.
	namespaces corelisters.NamespaceLister
}

// refusedClaim is an answer a Service's condition claims and why it is
// not believed.
type refusedClaim struct {
	svc    *v1.Service
	answer lb.Answer
	why    string
}

// trustedAnswers are, by VIP, the answers the Services' Announced
// conditions claim that the leader could have made: of a LoadBalancer
// Service this CCM serves, for a VIP its status.loadBalancer.ingress
// lists, in a pool that serves its namespace, and claimed alike by every
// Service that claims it (Services sharing a VIP get the same answer).
// Each other claim is refused, with why. A VIP claimed unlike by two
// Services is refused for each and answered by nobody: a forged claim can
// at worst stop a VIP being answered here, never move it, and nothing
// flips from pass to pass. A claim of no node asks nothing and is
// skipped.
func trustedAnswers(services []*v1.Service, r claimRules) (map[netip.Addr]lb.Answer, []refusedClaim) {
	// In key order, so that each refusal reads the same on every pass.
	services = slices.SortedFunc(slices.Values(services), func(a, b *v1.Service) int { return cmp.Compare(key(a), key(b)) })
	type claim struct {
		svc    *v1.Service
		answer lb.Answer
	}
	byVIP := map[netip.Addr][]claim{}
	var refused []refusedClaim
	for _, svc := range services {
		if svc.Spec.Type != v1.ServiceTypeLoadBalancer || !r.serves(svc) {
			continue
		}
		for _, a := range placement.AnnouncedAnswers(svc) {
			if a.MAC == nil {
				continue
			}
			if why := r.refusal(svc, a.VIP); why != "" {
				refused = append(refused, refusedClaim{svc: svc, answer: a, why: why})
				continue
			}
			byVIP[a.VIP] = append(byVIP[a.VIP], claim{svc, a})
		}
	}
	out := make(map[netip.Addr]lb.Answer, len(byVIP))
	for vip, claims := range byVIP {
		first := claims[0]
		agree := true
		for _, c := range claims[1:] {
			agree = agree && c.answer.Node == first.answer.Node && bytes.Equal(c.answer.MAC, first.answer.MAC)
		}
		if agree {
			out[vip] = first.answer
			continue
		}
		for _, c := range claims {
			other := claims[slices.IndexFunc(claims, func(o claim) bool {
				return o.answer.Node != c.answer.Node || !bytes.Equal(o.answer.MAC, c.answer.MAC)
			})]
			refused = append(refused, refusedClaim{svc: c.svc, answer: c.answer,
				why: fmt.Sprintf("Service %s claims it for %s: answered by neither until the claims agree", key(other.svc), answerer(other.answer))})
		}
	}
	return out, refused
}

// refusal says why svc may not claim vip, or "" if it may.
func (r claimRules) refusal(svc *v1.Service, vip netip.Addr) string {
	if !slices.ContainsFunc(svc.Status.LoadBalancer.Ingress, func(ing v1.LoadBalancerIngress) bool {
		ip, err := netip.ParseAddr(ing.IP)
		return err == nil && ip.Unmap() == vip
	}) {
		return "not in the Service's status.loadBalancer.ingress"
	}
	pool, ok := r.pools.For(vip)
	if !ok {
		return "in no loadBalancer pool"
	}
	var labels map[string]string
	if r.namespaces != nil {
		if ns, err := r.namespaces.Get(svc.Namespace); err == nil {
			labels = ns.Labels
		}
	}
	if !pool.Serves(svc.Namespace, labels) {
		return fmt.Sprintf("pool %q is kept for other namespaces than %s", pool.Name(), svc.Namespace)
	}
	return ""
}

// answerer names who an answer says answers: "node N (MAC)", or "MAC".
func answerer(a lb.Answer) string {
	if a.Node == "" {
		return a.MAC.String()
	}
	return fmt.Sprintf("node %s (%s)", a.Node, a.MAC)
}

// claimReporter tells a Service, with a Warning Event and a log line, of
// each claim of its condition refused claimGrace in a row: once per
// Service, VIP and reason while the refusal lasts. Each reader of the
// conditions keeps its own; their identical Events are counted as one by
// the recorder's correlator.
type claimReporter struct {
	recorder record.EventRecorder // nil: the log line only
	grace    time.Duration

	mu   sync.Mutex
	seen map[claimKey]claimSeen // the refusals of the last look
}

type claimKey struct {
	service string
	vip     netip.Addr
	why     string
}

type claimSeen struct {
	since time.Time // refused in every look since
	told  bool
}

func newClaimReporter(recorder record.EventRecorder, grace time.Duration) *claimReporter {
	return &claimReporter{recorder: recorder, grace: grace, seen: map[claimKey]claimSeen{}}
}

// note takes the refusals of a look at now: it tells of each refused for
// the grace and not told yet, forgets those no longer refused, and says
// whether some still wait for their grace to end (look again by then).
func (r *claimReporter) note(ctx context.Context, refused []refusedClaim, now time.Time) (pending bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[claimKey]claimSeen, len(refused))
	for _, c := range refused {
		k := claimKey{service: key(c.svc), vip: c.answer.VIP, why: c.why}
		s, ok := r.seen[k]
		if !ok {
			s = claimSeen{since: now}
		}
		if !s.told && now.Sub(s.since) >= r.grace {
			r.tell(ctx, c)
			s.told = true
		}
		pending = pending || !s.told
		seen[k] = s
	}
	r.seen = seen
	return pending
}

func (r *claimReporter) tell(ctx context.Context, c refusedClaim) {
	msg := fmt.Sprintf("%s condition claims %s for %s; not believed: %s", lb.ConditionAnnounced, c.answer.VIP, answerer(c.answer), c.why)
	klog.FromContext(ctx).Info("Refused a Service's claim to a VIP", "service", key(c.svc), "vip", c.answer.VIP, "why", c.why)
	if r.recorder != nil {
		r.recorder.Event(c.svc, v1.EventTypeWarning, EventClaimRefused, msg)
	}
}

// claimReader reads the conditions for one replica's use of them (its
// answers, its BGP routes), telling of the refused claims it would have
// acted on with a reporter of its own. It is a placement.Claims.
type claimReader struct {
	services corelisters.ServiceLister
	rules    claimRules
	report   *claimReporter
	informer cache.SharedIndexInformer // the Services'; nil if not watched
	synced   []cache.InformerSynced
}

var _ placement.Claims = (*claimReader)(nil)

// reader is a new reader of s's conditions.
func (s *announcedSource) reader() *claimReader {
	return &claimReader{services: s.services.Lister(), rules: s.rules, report: newClaimReporter(s.recorder, s.grace),
		informer: s.services.Informer(), synced: s.synced}
}

// OnChange calls f on every change of the Services until remove.
func (r *claimReader) OnChange(f func()) (remove func(), err error) {
	reg, err := follow.OnAnyChange(r.informer, f)
	if err != nil {
		return nil, err
	}
	return func() { _ = r.informer.RemoveEventHandler(reg) }, nil
}

// WaitSynced waits for the Services (and Namespaces, if read) to be cached.
func (r *claimReader) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), r.synced...)
}

// Answers are the answers trustedAnswers believes that mine accepts; it
// tells of the refused claims mine accepts, after claimGrace, and says
// whether some wait for it.
func (r *claimReader) Answers(ctx context.Context, mine func(lb.Answer) bool) (map[netip.Addr]lb.Answer, bool, error) {
	services, err := r.services.List(labels.Everything())
	if err != nil {
		return nil, false, err
	}
	answers, refused := trustedAnswers(services, r.rules)
	maps.DeleteFunc(answers, func(_ netip.Addr, a lb.Answer) bool { return !mine(a) })
	refused = slices.DeleteFunc(refused, func(c refusedClaim) bool { return !mine(c.answer) })
	return answers, r.report.note(ctx, refused, time.Now()), nil
}

// newAnnouncedSource reads the conditions from replica's informers, and
// the namespaces' labels if a pool selects namespaces by label; it tells
// the Services of refusals with client, until ctx ends.
func newAnnouncedSource(ctx context.Context, replica informers.SharedInformerFactory, client kubernetes.Interface, serves func(*v1.Service) bool, pools *lb.Pools) *announcedSource {
	services := replica.Core().V1().Services()
	src := &announcedSource{services: services, rules: claimRules{serves: serves, pools: pools},
		synced: []cache.InformerSynced{services.Informer().HasSynced}, recorder: newRecorder(ctx, client), grace: claimGrace}
	if pools != nil && pools.SelectsNamespaces() {
		ns := replica.Core().V1().Namespaces()
		src.rules.namespaces = ns.Lister()
		src.synced = append(src.synced, ns.Informer().HasSynced)
	}
	return src
}
