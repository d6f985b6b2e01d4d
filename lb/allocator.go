package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/labcloud/labcloud/metrics"
)

// Sentinels for errors.Is; the typed errors below carry the details and
// unwrap to them.
var (
	ErrPoolExhausted   = errors.New("pool exhausted")
	ErrNotInPool       = errors.New("address not in pool")
	ErrIPTaken         = errors.New("address taken")
	ErrUnknownPool     = errors.New("unknown pool")
	ErrPortConflict    = errors.New("port conflict on shared address")
	ErrAlreadyAssigned = errors.New("service already holds another address of this family")
	ErrInvalidRequest  = errors.New("invalid request")
	ErrNoPoolForFamily = errors.New("no pool has addresses of this family")
)

// PoolExhaustedError: no address of Family is free for the request.
type PoolExhaustedError struct {
	Pool   string // "" when any pool would have done
	Family Family
}

func (e *PoolExhaustedError) Error() string {
	if e.Pool == "" {
		return fmt.Sprintf("no free %s address in any pool", e.Family)
	}
	return fmt.Sprintf("pool %q has no free %s address", e.Pool, e.Family)
}

func (e *PoolExhaustedError) Unwrap() error { return ErrPoolExhausted }

// NoPoolForFamilyError: no pool the request may use has any address of
// Family, free or not: only a change of the Service or of the pools helps.
type NoPoolForFamilyError struct {
	Pool      string // "" when any pool serving Namespace would have done
	Namespace string
	Family    Family
}

func (e *NoPoolForFamilyError) Error() string {
	if e.Pool == "" {
		return fmt.Sprintf("no pool serving namespace %s has %s addresses", e.Namespace, e.Family)
	}
	return fmt.Sprintf("pool %q has no %s addresses", e.Pool, e.Family)
}

func (e *NoPoolForFamilyError) Unwrap() error { return ErrNoPoolForFamily }

// NotInPoolError: a requested or loaded address lies outside the requested
// pool, or outside every pool when Pool is "".
type NotInPoolError struct {
	IP   netip.Addr
	Pool string
}

func (e *NotInPoolError) Error() string {
	if e.Pool == "" {
		return fmt.Sprintf("%s is not in any pool", e.IP)
	}
	return fmt.Sprintf("%s is not in pool %q", e.IP, e.Pool)
}

func (e *NotInPoolError) Unwrap() error { return ErrNotInPool }

// IPTakenError: the address is held by Holder, which does not share it.
type IPTakenError struct {
	IP     netip.Addr
	Holder string
}

func (e *IPTakenError) Error() string {
	return fmt.Sprintf("%s is taken by %s", e.IP, e.Holder)
}

func (e *IPTakenError) Unwrap() error { return ErrIPTaken }

// UnknownPoolError: the request names a pool that is not configured.
type UnknownPoolError struct{ Pool string }

func (e *UnknownPoolError) Error() string { return fmt.Sprintf("unknown pool %q", e.Pool) }

func (e *UnknownPoolError) Unwrap() error { return ErrUnknownPool }

// PortConflictError: the address is shared under the same key, but Holder
// already uses Port on it.
type PortConflictError struct {
	IP     netip.Addr
	Holder string
	Port   Port
}

func (e *PortConflictError) Error() string {
	return fmt.Sprintf("%s on shared %s is already used by %s", e.Port, e.IP, e.Holder)
}

func (e *PortConflictError) Unwrap() error { return ErrPortConflict }

// holding is one Service's hold on an address.
type holding struct {
	key        string
	sharingKey string
	ports      []Port
}

// cursorKey names one family of one pool.
type cursorKey struct {
	pool   string
	family Family
}

// Allocator hands out VIPs from pools to Services named "namespace/name".
// It only keeps state in memory: the Service status is the record, loaded
// with Assign at start-up. It is safe for concurrent use.
type Allocator struct {
	pools *Pools

	mu      sync.Mutex
	byIP    map[netip.Addr][]holding       // holdings sorted by key
	ports   map[netip.Addr]map[Port]string // the key using each port at a shared address
	byKey   map[string][2]netip.Addr       // [0] IPv4, [1] IPv6; zero if none
	byShare map[string]map[netip.Addr]bool // scoped sharing key -> addresses under it
	cursor  map[cursorKey]netip.Addr       // every allocatable address below is held
	claimed map[netip.Addr]bool            // held addresses verified free on the wire
	inUse   map[string]int                 // pool name -> held addresses
}

// NewAllocator returns an empty allocator over pools; nil means no pools.
// It publishes each pool's size and use as labcloud_lb_pool_addresses and
// labcloud_lb_pool_addresses_in_use (one allocator per process does).
func NewAllocator(pools *Pools) *Allocator {
	if pools == nil {
		pools = &Pools{}
	}
	for _, p := range pools.list {
		metrics.PoolAddresses.WithLabelValues(p.name).Set(p.Size())
		metrics.PoolAddressesInUse.WithLabelValues(p.name).Set(0)
	}
	return &Allocator{
		pools:   pools,
		byIP:    map[netip.Addr][]holding{},
		ports:   map[netip.Addr]map[Port]string{},
		byKey:   map[string][2]netip.Addr{},
		byShare: map[string]map[netip.Addr]bool{},
		cursor:  map[cursorKey]netip.Addr{},
		claimed: map[netip.Addr]bool{},
		inUse:   map[string]int{},
	}
}

// used counts ip in (+1) or out (-1) of its pool's addresses in use and
// returns the pool's name, "" if ip lies in no pool.
func (a *Allocator) used(ip netip.Addr, delta int) string {
	p, ok := a.pools.For(ip)
	if !ok {
		return ""
	}
	a.inUse[p.name] += delta
	metrics.PoolAddressesInUse.WithLabelValues(p.name).Set(float64(a.inUse[p.name]))
	return p.name
}

// scope makes a Service's sharing key local to its namespace: Services
// share an address only with Services of their own namespace, whatever
// keys other namespaces pick. Keys are "namespace/name".
func scope(key, sharingKey string) string {
	if sharingKey == "" {
		return ""
	}
	ns, _, _ := strings.Cut(key, "/")
	return ns + "/" + sharingKey
}

// Assign records that key holds ip, as read from the Service status at
// start-up; call it for every existing Service before any Allocate so that
// no address moves or is handed out twice. An address from a status was
// claimed by the run that wrote it, so it counts as claimed. Assigning the same key and ip
// again only refreshes the request. An ip held by another key is accepted
// when the two share it properly (same sharing key, disjoint ports);
// otherwise the error says why and nothing changes.
func (a *Allocator) Assign(key string, ip netip.Addr, req Request) error {
	if !ip.IsValid() || plainAddr(ip) != nil {
		return fmt.Errorf("assign %s to %s: %w", ip, key, ErrInvalidRequest)
	}
	// The .0/.255 rule is not applied: an address in use stays in use.
	if _, ok := a.pools.For(ip); !ok {
		return fmt.Errorf("assign to %s: %w", key, &NotInPoolError{IP: ip})
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.byKey[key][FamilyOf(ip).index()]; old.IsValid() && old != ip {
		return fmt.Errorf("assign %s to %s, which holds %s: %w", ip, key, old, ErrAlreadyAssigned)
	}
	if err := a.canHold(key, ip, req); err != nil {
		return fmt.Errorf("assign to %s: %w", key, err)
	}
	a.hold(key, ip, req)
	a.claimed[ip] = true
	return nil
}

// Allocation is what Allocate gave a Service.
type Allocation struct {
	IPs     []netip.Addr // in the order of the request's families
	Skipped []Skipped    // families a PreferDualStack request went without
}

// Skipped is a family a PreferDualStack request went without, and why:
// Err is a *PoolExhaustedError or a *NoPoolForFamilyError.
type Skipped struct {
	Family Family
	Err    error
}

// Allocate returns key's VIPs, one per family of req, and records them.
// An address key already holds is kept while it still fits req, so calling
// Allocate again changes nothing. Otherwise the requested address, if free
// or properly shareable; otherwise, with a sharing key, the lowest address
// already shared under it that fits; otherwise the lowest free address of
// the requested pool, or of the pools in configuration order. Every family
// must get a VIP, except that PreferDualStack skips a family its pools
// cannot give (none free, or none of that family) and that it did not ask
// an address of, as long as one family gets a VIP. On error nothing
// changes, so a Service keeps its old VIP when a new request cannot be
// met.
func (a *Allocator) Allocate(key string, req Request) (Allocation, error) {
	fams, err := req.families()
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate for %s: %w", key, err)
	}
	if req.Pool != "" {
		p, ok := a.pools.Pool(req.Pool)
		if !ok {
			return Allocation{}, fmt.Errorf("allocate for %s: %w", key, &UnknownPoolError{Pool: req.Pool})
		}
		if ns, _, _ := strings.Cut(key, "/"); !p.Serves(ns, req.NamespaceLabels) {
			return Allocation{}, fmt.Errorf("allocate for %s: %w", key, &PoolNotForNamespaceError{Pool: p.name, Namespace: ns})
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Choose every family first and commit only if all succeed.
	var res Allocation
	for _, f := range fams {
		ip, err := a.choose(key, req, f)
		switch {
		case err == nil:
			res.IPs = append(res.IPs, ip)
		case skippable(req, f, err):
			res.Skipped = append(res.Skipped, Skipped{Family: f, Err: err})
		default:
			return Allocation{}, fmt.Errorf("allocate for %s: %w", key, err)
		}
	}
	if len(res.IPs) == 0 {
		return Allocation{}, fmt.Errorf("allocate for %s: %w", key, noneGiven(res.Skipped))
	}
	ips := res.IPs
	// Drop what key holds but no longer wants: a moved address, or a
	// family the Service gave up.
	for _, old := range a.byKey[key] {
		if old.IsValid() && !slices.Contains(ips, old) {
			a.drop(key, old)
		}
	}
	for _, ip := range ips {
		if len(a.byIP[ip]) == 0 {
			if p, ok := a.pools.For(ip); ok {
				metrics.Allocations.WithLabelValues(p.name).Inc()
			}
		}
		a.hold(key, ip, req)
	}
	return res, nil
}

// skippable reports whether a PreferDualStack request may go without
// family f, which its pools cannot give (err): not if it asked an address
// of f.
func skippable(req Request, f Family, err error) bool {
	if _, asked := req.IP(f); asked || req.Policy != PreferDualStack {
		return false
	}
	return errors.Is(err, ErrPoolExhausted) || errors.Is(err, ErrNoPoolForFamily)
}

// noneGiven is the error of a request that skipped every family: it
// unwraps to each family's.
func noneGiven(skipped []Skipped) error {
	if len(skipped) == 1 {
		return skipped[0].Err
	}
	return fmt.Errorf("%w; %w", skipped[0].Err, skipped[1].Err)
}

// choose picks key's address of family f. It records nothing but may
// advance a pool cursor past addresses that are held anyway.
func (a *Allocator) choose(key string, req Request, f Family) (netip.Addr, error) {
	if held := a.byKey[key][f.index()]; held.IsValid() && a.fits(key, held, req) {
		return held, nil
	}
	if want, ok := req.IP(f); ok {
		p, ok := a.pools.For(want)
		if !ok || !p.Contains(want) || req.Pool != "" && p.name != req.Pool {
			return netip.Addr{}, &NotInPoolError{IP: want, Pool: req.Pool}
		}
		if ns, _, _ := strings.Cut(key, "/"); !p.Serves(ns, req.NamespaceLabels) {
			return netip.Addr{}, &PoolNotForNamespaceError{Pool: p.name, Namespace: ns}
		}
		if err := a.canHold(key, want, req); err != nil {
			return netip.Addr{}, err
		}
		return want, nil
	}
	pools := a.pools.serving(key, req.NamespaceLabels)
	if req.Pool != "" {
		p, _ := a.pools.Pool(req.Pool) // checked by Allocate
		pools = []*Pool{p}
	}
	if ip, ok := a.sharedFit(key, req, f, pools); ok {
		return ip, nil
	}
	for _, p := range pools {
		ck := cursorKey{p.name, f}
		ip, ok := p.lowest(f, a.cursor[ck], func(ip netip.Addr) bool { return len(a.byIP[ip]) > 0 })
		if ok {
			a.cursor[ck] = ip // nothing below ip is free
			return ip, nil
		}
	}
	if !slices.ContainsFunc(pools, func(p *Pool) bool { return p.Has(f) }) {
		ns, _, _ := strings.Cut(key, "/")
		return netip.Addr{}, &NoPoolForFamilyError{Pool: req.Pool, Namespace: ns, Family: f}
	}
	return netip.Addr{}, &PoolExhaustedError{Pool: req.Pool, Family: f}
}

// fits reports whether the address key holds still satisfies req.
func (a *Allocator) fits(key string, held netip.Addr, req Request) bool {
	if want, ok := req.IP(FamilyOf(held)); ok && want != held {
		return false
	}
	if req.Pool != "" {
		if p, ok := a.pools.Pool(req.Pool); !ok || !p.inRange(held) {
			return false
		}
	}
	return a.canHold(key, held, req) == nil
}

// sharedFit finds the lowest address of family f in pools already shared
// under req.SharingKey that key may join, so that Services with one key
// gather on one VIP (one per family) without naming it.
func (a *Allocator) sharedFit(key string, req Request, f Family, pools []*Pool) (netip.Addr, bool) {
	if req.SharingKey == "" {
		return netip.Addr{}, false
	}
	var best netip.Addr
	for ip := range a.byShare[scope(key, req.SharingKey)] {
		if FamilyOf(ip) != f || best.IsValid() && best.Less(ip) {
			continue
		}
		in := slices.ContainsFunc(pools, func(p *Pool) bool { return p.Contains(ip) })
		if in && a.canHold(key, ip, req) == nil {
			best = ip
		}
	}
	return best, best.IsValid()
}

// canHold reports why key may not hold ip next to its current holders:
// every other holder must be in key's namespace, with the same non-empty
// sharing key and no port in common with req. It costs one lookup per
// holder and per port of req, whatever the other holders' ports.
func (a *Allocator) canHold(key string, ip netip.Addr, req Request) error {
	share := scope(key, req.SharingKey)
	for _, h := range a.byIP[ip] {
		if h.key != key && (share == "" || h.sharingKey != share) {
			return &IPTakenError{IP: ip, Holder: h.key}
		}
	}
	used := a.ports[ip]
	for _, p := range req.Ports {
		if k, ok := used[p]; ok && k != key {
			return &PortConflictError{IP: ip, Holder: k, Port: p}
		}
	}
	return nil
}

// usePorts records (on) or forgets (off) that key uses ports at ip.
func (a *Allocator) usePorts(key string, ip netip.Addr, ports []Port, on bool) {
	used := a.ports[ip]
	if on && used == nil {
		used = make(map[Port]string, len(ports))
		a.ports[ip] = used
	}
	for _, p := range ports {
		switch k, ok := used[p]; {
		case on && !ok:
			used[p] = key
		case !on && k == key:
			delete(used, p)
		}
	}
	if len(used) == 0 {
		delete(a.ports, ip)
	}
}

// hold records key's holding of ip, updating it if key already has
// one there.
func (a *Allocator) hold(key string, ip netip.Addr, req Request) {
	h := holding{key: key, sharingKey: scope(key, req.SharingKey), ports: slices.Clone(req.Ports)}
	hs := a.byIP[ip]
	i, found := slices.BinarySearchFunc(hs, key, func(h holding, k string) int { return strings.Compare(h.key, k) })
	if found {
		old := hs[i]
		hs[i] = h
		a.unshare(old.sharingKey, ip, hs)
		a.usePorts(key, ip, old.ports, false)
	} else {
		if len(hs) == 0 {
			a.used(ip, +1)
		}
		hs = slices.Insert(hs, i, h)
	}
	a.byIP[ip] = hs
	a.usePorts(key, ip, h.ports, true)
	if h.sharingKey != "" {
		if a.byShare[h.sharingKey] == nil {
			a.byShare[h.sharingKey] = map[netip.Addr]bool{}
		}
		a.byShare[h.sharingKey][ip] = true
	}
	ka := a.byKey[key]
	ka[FamilyOf(ip).index()] = ip
	a.byKey[key] = ka
}

// drop removes key's holding of ip and frees ip when no one is left.
func (a *Allocator) drop(key string, ip netip.Addr) {
	hs := a.byIP[ip]
	i := slices.IndexFunc(hs, func(h holding) bool { return h.key == key })
	if i < 0 {
		return
	}
	gone := hs[i]
	hs = slices.Delete(hs, i, i+1)
	a.unshare(gone.sharingKey, ip, hs)
	a.usePorts(key, ip, gone.ports, false)
	if len(hs) == 0 {
		if pool := a.used(ip, -1); pool != "" {
			metrics.Releases.WithLabelValues(pool).Inc()
		}
		delete(a.byIP, ip)
		delete(a.claimed, ip)
		// Keep the cursor's promise that everything below it is held.
		if p, ok := a.pools.For(ip); ok {
			ck := cursorKey{p.name, FamilyOf(ip)}
			if c, ok := a.cursor[ck]; ok && ip.Less(c) {
				a.cursor[ck] = ip
			}
		}
	} else {
		a.byIP[ip] = hs
	}
	ka := a.byKey[key]
	ka[FamilyOf(ip).index()] = netip.Addr{}
	if ka == [2]netip.Addr{} {
		delete(a.byKey, key)
	} else {
		a.byKey[key] = ka
	}
}

// unshare removes ip from the index of sharingKey unless one of the
// holders hs still uses that key.
func (a *Allocator) unshare(sharingKey string, ip netip.Addr, hs []holding) {
	if sharingKey == "" || slices.ContainsFunc(hs, func(h holding) bool { return h.sharingKey == sharingKey }) {
		return
	}
	delete(a.byShare[sharingKey], ip)
	if len(a.byShare[sharingKey]) == 0 {
		delete(a.byShare, sharingKey)
	}
}

// Release forgets every address key holds; an address shared with others
// stays theirs.
func (a *Allocator) Release(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ip := range a.byKey[key] {
		if ip.IsValid() {
			a.drop(key, ip)
		}
	}
}

// Lookup returns the addresses key holds, IPv4 first; nil if none.
func (a *Allocator) Lookup(key string) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for _, ip := range a.byKey[key] {
		if ip.IsValid() {
			out = append(out, ip)
		}
	}
	return out
}

// VIP is one held address as the placement sees it.
type VIP struct {
	IP      netip.Addr
	Holders []string // keys, sorted
	// Claimed: nobody else answered for the address when it was probed
	// (or it came from a Service status); only claimed VIPs are announced.
	Claimed bool
}

// VIPs returns every held address, sorted.
func (a *Allocator) VIPs() []VIP {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]VIP, 0, len(a.byIP))
	for ip, hs := range a.byIP {
		v := VIP{IP: ip, Claimed: a.claimed[ip], Holders: make([]string, len(hs))}
		for i, h := range hs {
			v.Holders[i] = h.key
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(x, y VIP) int { return x.IP.Compare(y.IP) })
	return out
}

// Holders returns the keys of the Services holding ip, as VIPs does.
func (a *Allocator) Holders(ip netip.Addr) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, len(a.byIP[ip]))
	for i, h := range a.byIP[ip] {
		out[i] = h.key
	}
	return out
}

// Claim marks a held address as verified free on the wire; false if no
// one holds it (it was released meanwhile).
func (a *Allocator) Claim(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byIP[ip]) == 0 {
		return false
	}
	a.claimed[ip] = true
	return true
}

// Claimed reports whether ip is held and claimed.
func (a *Allocator) Claimed(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claimed[ip]
}

// InPools reports whether ip lies in a configured pool.
func (a *Allocator) InPools(ip netip.Addr) bool {
	_, ok := a.pools.For(ip)
	return ok
}
