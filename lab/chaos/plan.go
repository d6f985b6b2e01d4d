package chaos

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// FaultKind is one kind of fault `labcloud chaos` injects.
type FaultKind string

// The faults, each injected and then recovered from after a hold time.
const (
	// FaultNodeStop stops a node's domain the way an operator does (ACPI
	// shutdown, then libvirt's graceful destroy), then starts it again.
	FaultNodeStop FaultKind = "node-stop"
	// FaultNodeKill kills a node's QEMU with SIGKILL (a crash libvirt only
	// learns of from the process dying), then starts the domain again.
	FaultNodeKill FaultKind = "node-kill"
	// FaultCCMKill SIGKILLs the CCM and starts it again as the lab did.
	FaultCCMKill FaultKind = "ccm-kill"
	// FaultLibvirtd stops libvirtd (SIGTERM or SIGKILL) and starts it
	// again as the lab did; guests keep running.
	FaultLibvirtd FaultKind = "libvirtd-restart"
	// FaultBridgeFlap sets the bridge's link down, then up.
	FaultBridgeFlap FaultKind = "bridge-flap"
	// FaultNetRecreate destroys the lab network (the bridge goes away) and
	// creates it again, re-attaching the guests' and the LAN client's ports.
	FaultNetRecreate FaultKind = "network-recreate"
	// FaultServiceCreate creates LoadBalancer Services (one, or two with a
	// sharing key, in one namespace or in two).
	FaultServiceCreate FaultKind = "service-create"
	// FaultServiceDelete deletes one of the Services chaos created.
	FaultServiceDelete FaultKind = "service-delete"
	// FaultHostLoss takes a whole hypervisor host (not the first) off a
	// lab of several, as a power cut would (lab.LoseHost), then brings it
	// back with its guests and CCM replica (lab.RestoreHost).
	FaultHostLoss FaultKind = "host-loss"
	// FaultLeaderHostLoss is a host-loss whose host's replica leads when
	// it is injected (never drawn: the session turns a host-loss into it).
	// Losing that host loses the leader too: the lost host's VIPs move
	// only once the lease does, so it is judged as ccm-kill is.
	FaultLeaderHostLoss FaultKind = "host-loss-leader"
)

// FaultKinds are all kinds, in a fixed order: the plan's draws depend on it.
func FaultKinds() []FaultKind {
	return []FaultKind{FaultNodeStop, FaultNodeKill, FaultCCMKill, FaultLibvirtd, FaultBridgeFlap, FaultNetRecreate, FaultServiceCreate, FaultServiceDelete, FaultHostLoss}
}

// reportedKinds are the kinds a summary reports, in order: every drawn
// kind, then those a drawn fault may turn into.
func reportedKinds() []FaultKind { return append(FaultKinds(), FaultLeaderHostLoss) }

// faultPolicy says how a fault kind is judged.
type faultPolicy struct {
	// Outage: the invariants may not hold at all between injection and
	// recovery (nothing answers while the CCM or the bridge is gone).
	// Otherwise they must hold again within Settle of the injection as
	// well as of the recovery (a libvirtd restart must not cost a VIP).
	Outage bool
	// Settle is how long after an injection or recovery the invariants
	// may still be broken.
	Settle time.Duration
	weight int
	// hold is the range of time between injection and recovery.
	holdMin, holdMax time.Duration
}

// policy gives the kind's settle bound, weight and hold. Settle bounds
// follow the contract (DESIGN.md): a stopped domain's VIPs move at once, a
// libvirtd restart costs nothing, a bridge that is back is answered on at
// once and its routes come back with the next route reconcile (2 s); a
// restarted CCM first waits out its predecessor's leader lease (15 s) and
// syncs its informers.
func (k FaultKind) policy() faultPolicy {
	switch k {
	case FaultNodeStop, FaultNodeKill:
		return faultPolicy{Settle: 5 * time.Second, weight: 2, holdMin: 5 * time.Second, holdMax: 15 * time.Second}
	case FaultCCMKill:
		return faultPolicy{Outage: true, Settle: 35 * time.Second, weight: 2, holdMin: 0, holdMax: 5 * time.Second} // the unit restarts it after 5 s
	case FaultLibvirtd:
		return faultPolicy{Settle: 3 * time.Second, weight: 2, holdMin: 2 * time.Second, holdMax: 10 * time.Second}
	case FaultBridgeFlap:
		return faultPolicy{Outage: true, Settle: 5 * time.Second, weight: 2, holdMin: time.Second, holdMax: 4 * time.Second}
	case FaultNetRecreate:
		return faultPolicy{Outage: true, Settle: 10 * time.Second, weight: 1, holdMin: time.Second, holdMax: 4 * time.Second}
	case FaultServiceCreate:
		return faultPolicy{Settle: 10 * time.Second, weight: 2}
	case FaultServiceDelete:
		return faultPolicy{Settle: 10 * time.Second, weight: 1}
	case FaultLeaderHostLoss:
		return faultPolicy{Outage: true, Settle: 35 * time.Second, holdMin: 10 * time.Second, holdMax: 20 * time.Second}
	case FaultHostLoss:
		// The lost host's VIPs move once libvirt's keepalive gives the
		// silent host up (about 4 s) and its guests miss two probe rounds;
		// back, its guests boot and report before they answer again.
		return faultPolicy{Settle: 8 * time.Second, weight: 2, holdMin: 10 * time.Second, holdMax: 20 * time.Second}
	}
	return faultPolicy{Settle: 10 * time.Second}
}

// isNode: the fault takes nodes down, so it waits until every node can
// answer again.
func (k FaultKind) isNode() bool {
	return k == FaultNodeStop || k == FaultNodeKill || k == FaultHostLoss || k == FaultLeaderHostLoss
}

// PlannedService is a LoadBalancer Service chaos creates.
type PlannedService struct {
	Namespace, Name string
	SharingKey      string
	Port            int32
}

// Key is namespace/name.
func (s PlannedService) Key() string { return s.Namespace + "/" + s.Name }

// Namespace holds the second Service of a cross-namespace pair: the
// same sharing key in another namespace must not share an IP.
const Namespace = "labcloud-chaos"

// Fault is one planned fault.
type Fault struct {
	Kind   FaultKind
	Node   string // node faults
	Host   string // host-loss
	Signal string // libvirtd-restart: TERM or KILL
	Hold   time.Duration
	// Gap is the quiet time after the fault has settled, before the next.
	Gap    time.Duration
	Create []PlannedService
	Delete *PlannedService
}

func (f Fault) String() string {
	s := string(f.Kind)
	switch {
	case f.Node != "":
		s += " " + f.Node
	case f.Host != "":
		s += " " + f.Host
	case f.Signal != "":
		s += " SIG" + f.Signal
	case f.Delete != nil:
		s += " " + f.Delete.Key()
	}
	for i, c := range f.Create {
		if i == 0 {
			s += " "
		} else {
			s += ", "
		}
		s += c.Key()
		if c.SharingKey != "" {
			s += " (key " + c.SharingKey + ")"
		}
	}
	if f.Hold > 0 {
		s += fmt.Sprintf(" for %s", f.Hold.Round(100*time.Millisecond))
	}
	return s
}

// maxServices bounds the Services chaos keeps at once (the lab's
// pool has 51 addresses).
const maxServices = 8

// Plan is the seeded sequence of faults: the same seed and nodes give the
// same faults in the same order. It tracks the Services it created.
type Plan struct {
	rng   *rand.Rand
	nodes []string
	hosts []string // the hosts that may be lost: all but the first
	live  []PlannedService
	n     int
}

// NewPlan starts the sequence for seed over the lab's nodes and the hosts
// that may be lost (none in a lab of one host). With fewer than two nodes
// no node is ever stopped: its VIPs would have nowhere to go.
func NewPlan(seed int64, nodes, losableHosts []string) *Plan {
	return &Plan{rng: rand.New(rand.NewPCG(uint64(seed), 0x6c6162636c6f7564)), nodes: nodes, hosts: losableHosts}
}

// Next returns the next fault. The first two create Services (a pair
// sharing a key, then one alone) so that there are VIPs to check.
func (p *Plan) Next() Fault {
	p.n++
	var f Fault
	switch p.n {
	case 1:
		f = p.create(1)
	case 2:
		f = p.create(0)
	default:
		f = p.draw()
	}
	f.Gap = p.between(time.Second, 5*time.Second)
	return f
}

func (p *Plan) draw() Fault {
	total := 0
	kinds := FaultKinds()
	for _, k := range kinds {
		total += p.weight(k)
	}
	r := p.rng.IntN(total)
	kind := kinds[len(kinds)-1]
	for _, k := range kinds {
		if r < p.weight(k) {
			kind = k
			break
		}
		r -= p.weight(k)
	}
	pol := kind.policy()
	f := Fault{Kind: kind, Hold: p.between(pol.holdMin, pol.holdMax)}
	switch kind {
	case FaultNodeStop, FaultNodeKill:
		f.Node = p.nodes[p.rng.IntN(len(p.nodes))]
	case FaultLibvirtd:
		f.Signal = []string{"TERM", "KILL"}[p.rng.IntN(2)]
	case FaultHostLoss:
		f.Host = p.hosts[p.rng.IntN(len(p.hosts))]
	case FaultServiceCreate:
		if len(p.live) >= maxServices {
			return p.delete()
		}
		return p.create(p.rng.IntN(3))
	case FaultServiceDelete:
		if len(p.live) == 0 {
			return p.create(p.rng.IntN(3))
		}
		return p.delete()
	}
	return f
}

func (p *Plan) weight(k FaultKind) int {
	if k.isNode() && len(p.nodes) < 2 || k == FaultHostLoss && len(p.hosts) == 0 {
		return 0
	}
	return k.policy().weight
}

// create makes Services of one variant: 0 one alone, 1 two sharing a key
// in one namespace, 2 two with one key in two namespaces.
func (p *Plan) create(variant int) Fault {
	name := fmt.Sprintf("chaos-%d", p.n)
	var svcs []PlannedService
	switch variant {
	case 0:
		svcs = []PlannedService{{Namespace: "default", Name: name, Port: 80}}
	case 1:
		svcs = []PlannedService{{Namespace: "default", Name: name + "-a", SharingKey: name, Port: 80}, {Namespace: "default", Name: name + "-b", SharingKey: name, Port: 81}}
	default:
		svcs = []PlannedService{{Namespace: "default", Name: name + "-a", SharingKey: name, Port: 80}, {Namespace: Namespace, Name: name + "-b", SharingKey: name, Port: 81}}
	}
	p.live = append(p.live, svcs...)
	return Fault{Kind: FaultServiceCreate, Create: svcs}
}

func (p *Plan) delete() Fault {
	i := p.rng.IntN(len(p.live))
	d := p.live[i]
	p.live = append(p.live[:i], p.live[i+1:]...)
	return Fault{Kind: FaultServiceDelete, Delete: &d}
}

// between draws a duration in [lo, hi], to 100 ms.
func (p *Plan) between(lo, hi time.Duration) time.Duration {
	steps := int64((hi - lo) / (100 * time.Millisecond))
	if steps <= 0 {
		return lo
	}
	return lo + time.Duration(p.rng.Int64N(steps+1))*100*time.Millisecond
}
