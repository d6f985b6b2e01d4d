package placement

import "time"

// LocalEndpointWarmup is how long a node that gains a ready endpoint of a
// Service with externalTrafficPolicy Local waits before it answers the
// Service's VIP or is spread to, while nodes with older endpoints serve it.
// A pod without a readiness probe is Ready when its container starts, before
// its server listens, and its node's kernel resets what reaches it until
// then; cloud load balancers hold a new backend back until its health checks
// pass in the same way.
const LocalEndpointWarmup = 10 * time.Second

// endpointAges is when this process first saw each node hold a ready
// endpoint of each Service with externalTrafficPolicy Local: Service key →
// node → time. A zero time is an endpoint that was there when this process
// first saw the Service: after a restart or a failover of the leader, every
// endpoint counts as old.
type endpointAges map[string]map[string]time.Time

// serving notes ready, the nodes holding a ready endpoint of Service k now,
// and says which of them may serve it at now: those whose endpoint is at
// least warmup old, or, when none is, the oldest (a new Service, or every
// endpoint replaced at once, is served at once). next is when the first of
// the others may serve; zero if none waits.
func (a endpointAges) serving(k string, ready map[string]bool, now time.Time, warmup time.Duration) (out map[string]bool, next time.Time) {
	seen, known := a[k]
	if !known {
		seen = make(map[string]time.Time, len(ready))
		a[k] = seen
	}
	for n := range seen {
		if !ready[n] {
			delete(seen, n)
		}
	}
	for n := range ready {
		if _, ok := seen[n]; !ok {
			seen[n] = now
			if !known {
				seen[n] = time.Time{}
			}
		}
	}
	out = make(map[string]bool, len(seen))
	oldest, first := time.Time{}, true
	for n, t := range seen {
		if !t.Add(warmup).After(now) {
			out[n] = true
		}
		if first || t.Before(oldest) {
			oldest, first = t, false
		}
	}
	if len(out) == 0 {
		for n, t := range seen {
			if t.Equal(oldest) {
				out[n] = true
			}
		}
	}
	for n, t := range seen {
		if end := t.Add(warmup); !out[n] && (next.IsZero() || end.Before(next)) {
			next = end
		}
	}
	return out, next
}

// keepOnly forgets the Services not in seen, this pass's.
func (a endpointAges) keepOnly(seen map[string]map[string]bool) {
	for k := range a {
		if _, ok := seen[k]; !ok {
			delete(a, k)
		}
	}
}
