// Package lb holds the pure decisions behind labcloud's LoadBalancer
// Services: which addresses a pool offers, what a Service asks for in its
// annotations, which VIP it gets and which node answers for it. Nothing here
// does I/O; the provider applies the results.
package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go4.org/netipx"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ErrPoolOverlap marks a configuration in which two address specs, in one
// pool or in two, share an address: an address must have exactly one owner.
var ErrPoolOverlap = errors.New("address ranges overlap")

// PoolConfig is one pool as written in the cloud config.
type PoolConfig struct {
	// Name is what the lb.labcloud.io/pool annotation refers to.
	Name string `json:"name"`
	// Addresses are CIDRs ("192.168.50.0/24", "fd00:50::/120"), inclusive
	// ranges ("192.168.50.10-192.168.50.20") or single addresses.
	Addresses []string `json:"addresses"`
	// AvoidDot0Dot255 keeps IPv4 addresses ending in .0 or .255 out of the
	// pool: some clients and firmware treat them as network or broadcast
	// addresses even inside a larger prefix.
	AvoidDot0Dot255 bool `json:"avoidDot0Dot255,omitempty"`
	// Namespaces and NamespaceSelector keep the pool for some namespaces:
	// those named, and those whose labels the selector matches. With
	// neither, the pool serves every namespace.
	Namespaces        []string              `json:"namespaces,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// ipRange is an inclusive range of one family, with the spec it came from
// so that errors can quote the user's own words.
type ipRange struct {
	netipx.IPRange
	spec string
}

// Pool is a parsed, validated pool. It is immutable.
type Pool struct {
	name       string
	ranges     []ipRange // sorted by From, non-overlapping
	avoid      bool
	excluded   []netip.Addr    // in its ranges, never handed out; sorted
	namespaces []string        // sorted; with selector nil and this empty, every namespace
	selector   labels.Selector // nil: none
}

// NewPool parses one pool. Errors name the pool and the bad spec.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if err := validName(cfg.Name); err != nil {
		return nil, fmt.Errorf("pool %q: %w", cfg.Name, err)
	}
	if len(cfg.Addresses) == 0 {
		return nil, fmt.Errorf("pool %q: no addresses", cfg.Name)
	}
	p := &Pool{name: cfg.Name, avoid: cfg.AvoidDot0Dot255}
	if err := p.keepFor(cfg.Namespaces, cfg.NamespaceSelector); err != nil {
		return nil, fmt.Errorf("pool %q: %w", cfg.Name, err)
	}
	for _, spec := range cfg.Addresses {
		r, err := parseSpec(spec)
		if err == nil {
			err = checkUsable(r.IPRange)
		}
		if err != nil {
			return nil, fmt.Errorf("pool %q: address %q: %w", cfg.Name, spec, err)
		}
		p.ranges = append(p.ranges, r)
	}
	slices.SortFunc(p.ranges, byFrom)
	for i := 1; i < len(p.ranges); i++ {
		if prev, r := p.ranges[i-1], p.ranges[i]; prev.Overlaps(r.IPRange) {
			return nil, fmt.Errorf("pool %q: %q and %q: %w", cfg.Name, prev.spec, r.spec, ErrPoolOverlap)
		}
	}
	return p, nil
}

func byFrom(a, b ipRange) int { return a.From().Compare(b.From()) }

// validName accepts names that survive being written in an annotation: a
// non-empty Kubernetes label value (letters, digits, '-', '_' and '.', at
// most 63, starting and ending with a letter or digit).
func validName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if len(content.IsLabelValue(name)) > 0 {
		return errors.New("name not allowed: use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
	}
	return nil
}

// parseSpec reads a CIDR, a "first-last" range or a single address.
func parseSpec(spec string) (ipRange, error) {
	s := strings.TrimSpace(spec)
	switch {
	case s == "":
		return ipRange{}, errors.New("empty")
	case strings.Contains(s, "/"):
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return ipRange{}, err
		}
		if err := plainAddr(pfx.Addr()); err != nil {
			return ipRange{}, err
		}
		// A prefix with host bits set is almost always a typo for the
		// network it sits in; guessing either way could hand out the
		// wrong addresses.
		if m := pfx.Masked(); m != pfx {
			return ipRange{}, fmt.Errorf("host bits set (did you mean %s?)", m)
		}
		return ipRange{netipx.RangeOfPrefix(pfx), spec}, nil
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		first, err := parseAddr(strings.TrimSpace(a))
		if err != nil {
			return ipRange{}, err
		}
		last, err := parseAddr(strings.TrimSpace(b))
		if err != nil {
			return ipRange{}, err
		}
		if FamilyOf(first) != FamilyOf(last) {
			return ipRange{}, errors.New("range mixes IPv4 and IPv6")
		}
		if last.Less(first) {
			return ipRange{}, fmt.Errorf("range ends (%s) before it starts (%s)", last, first)
		}
		return ipRange{netipx.IPRangeFrom(first, last), spec}, nil
	default:
		ip, err := parseAddr(s)
		if err != nil {
			return ipRange{}, err
		}
		return ipRange{netipx.IPRangeFrom(ip, ip), spec}, nil
	}
}

// parseAddr parses an address that can be a VIP.
func parseAddr(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return ip, plainAddr(ip)
}

// plainAddr rejects forms that compare unequal to the address a kernel or a
// Service status would show: zones and IPv4-mapped IPv6.
func plainAddr(ip netip.Addr) error {
	if ip.Zone() != "" {
		return fmt.Errorf("%s: zones are not allowed", ip)
	}
	if ip.Is4In6() {
		return fmt.Errorf("%s: IPv4-mapped IPv6 is not allowed, write %s", ip, ip.Unmap())
	}
	return nil
}

// Name returns the pool's name.
func (p *Pool) Name() string { return p.name }

// Has reports whether the pool has addresses of family f.
func (p *Pool) Has(f Family) bool {
	for _, r := range p.ranges {
		if FamilyOf(r.From()) == f {
			return true
		}
	}
	return false
}

// Contains reports whether ip may be handed out from the pool: inside one
// of its ranges and not an avoided .0/.255.
func (p *Pool) Contains(ip netip.Addr) bool {
	return p.inRange(ip) && p.allocatable(ip)
}

// inRange reports whether ip lies in one of the ranges, ignoring the .0/.255
// rule, so that an address already in use is recognised as the pool's.
func (p *Pool) inRange(ip netip.Addr) bool {
	for _, r := range p.ranges {
		if r.Contains(ip) {
			return true
		}
	}
	return false
}

// Size is the number of addresses the pool can hand out: every address of
// its ranges, less the .0/.255 ones it avoids. Large IPv6 ranges are
// counted as a float64, exact up to 2^53.
func (p *Pool) Size() float64 {
	var n float64
	for _, r := range p.ranges {
		n += rangeSize(r.From(), r.To())
		if p.avoid && r.From().Is4() {
			a, b := v4(r.From()), v4(r.To())
			n -= float64(congruent(a, b, 0) + congruent(a, b, 255))
		}
	}
	for _, ip := range p.excluded {
		if !(p.avoid && ip.Is4() && (ip.As4()[3] == 0 || ip.As4()[3] == 255)) {
			n-- // not already left out as a .0/.255
		}
	}
	return n
}

// rangeSize counts the addresses from first to last inclusive.
func rangeSize(first, last netip.Addr) float64 {
	f, l := first.As16(), last.As16()
	var hiF, loF, hiL, loL uint64
	for i := range 8 {
		hiF, hiL = hiF<<8|uint64(f[i]), hiL<<8|uint64(l[i])
		loF, loL = loF<<8|uint64(f[8+i]), loL<<8|uint64(l[8+i])
	}
	hi, lo := hiL-hiF, loL-loF
	if loL < loF {
		hi-- // borrow
	}
	return float64(hi)*(1<<64) + float64(lo) + 1
}

func v4(ip netip.Addr) int64 {
	b := ip.As4()
	return int64(b[0])<<24 | int64(b[1])<<16 | int64(b[2])<<8 | int64(b[3])
}

// congruent counts the x in [a, b] with x mod 256 == r.
func congruent(a, b, r int64) int64 {
	upTo := func(n int64) int64 { // the x in [0, n]
		if n < r {
			return 0
		}
		return (n-r)/256 + 1
	}
	return upTo(b) - upTo(a-1)
}

func (p *Pool) allocatable(ip netip.Addr) bool {
	if _, found := slices.BinarySearchFunc(p.excluded, ip, netip.Addr.Compare); found {
		return false
	}
	if !p.avoid || !ip.Is4() {
		return true
	}
	last := ip.As4()[3]
	return last != 0 && last != 255
}

// lowest returns the lowest allocatable address of family f at or above
// from (the pool's start when from is the zero Addr) for which used is
// false.
func (p *Pool) lowest(f Family, from netip.Addr, used func(netip.Addr) bool) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if FamilyOf(r.From()) != f || (from.IsValid() && r.To().Less(from)) {
			continue
		}
		ip := r.From()
		if from.IsValid() && ip.Less(from) {
			ip = from
		}
		for {
			if p.allocatable(ip) && !used(ip) {
				return ip, true
			}
			if ip == r.To() {
				break
			}
			ip = ip.Next()
		}
	}
	return netip.Addr{}, false
}

// Pools is the validated set of pools, in configuration order. It is
// immutable.
type Pools struct {
	list   []*Pool
	byName map[string]*Pool
}

// NewPools parses every pool and rejects duplicate names and addresses
// claimed by two pools. No pools at all is valid: nothing can be allocated.
func NewPools(cfgs []PoolConfig) (*Pools, error) {
	ps := &Pools{byName: make(map[string]*Pool, len(cfgs))}
	type owned struct {
		ipRange
		pool string
	}
	var all []owned
	for _, cfg := range cfgs {
		p, err := NewPool(cfg)
		if err != nil {
			return nil, err
		}
		if _, dup := ps.byName[p.name]; dup {
			return nil, fmt.Errorf("pool %q: defined twice", p.name)
		}
		ps.byName[p.name] = p
		ps.list = append(ps.list, p)
		for _, r := range p.ranges {
			all = append(all, owned{r, p.name})
		}
	}
	// Sorted by start, a range overlaps an earlier one exactly when it
	// starts at or before the furthest end seen so far.
	slices.SortFunc(all, func(a, b owned) int { return byFrom(a.ipRange, b.ipRange) })
	var far owned // the range reaching furthest among those already checked
	for i, r := range all {
		if i > 0 && far.Overlaps(r.IPRange) {
			return nil, fmt.Errorf("pool %q (%s) and pool %q (%s): %w", far.pool, far.spec, r.pool, r.spec, ErrPoolOverlap)
		}
		if i == 0 || far.To().Less(r.To()) {
			far = r
		}
	}
	return ps, nil
}

// Pool returns the pool with the given name.
func (ps *Pools) Pool(name string) (*Pool, bool) {
	p, ok := ps.byName[name]
	return p, ok
}

// For returns the pool whose ranges hold ip, whether or not ip is an avoided
// .0/.255.
func (ps *Pools) For(ip netip.Addr) (*Pool, bool) {
	for _, p := range ps.list {
		if p.inRange(ip) {
			return p, true
		}
	}
	return nil, false
}

// Excluding returns the pools with ips never handed out: the network and
// broadcast addresses of the bridge's subnets, which a pool of a part of a
// subnet would otherwise hand out at its edge. An address a Service holds
// already stays held (Assign does not check it).
func (ps *Pools) Excluding(ips []netip.Addr) *Pools {
	out := &Pools{byName: make(map[string]*Pool, len(ps.list))}
	for _, p := range ps.list {
		q := *p
		q.excluded = nil
		for _, ip := range ips {
			if p.inRange(ip) && !slices.Contains(q.excluded, ip) {
				q.excluded = append(q.excluded, ip)
			}
		}
		slices.SortFunc(q.excluded, netip.Addr.Compare)
		out.list = append(out.list, &q)
		out.byName[q.name] = &q
	}
	return out
}

// List returns the pools in configuration order.
func (ps *Pools) List() []*Pool { return slices.Clone(ps.list) }
