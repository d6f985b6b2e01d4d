package libvirtcloud

import "sync"

// Event says a domain changed: it appeared, changed state, or (Removed) was
// undefined. Domain is the snapshot after the change (before, if Removed).
type Event struct {
	Domain  Domain
	Removed bool
	// Unparsable is set when the domain was found unparsable, or for a new
	// reason: it left the cache, and Domain holds only its UUID, name, zone
	// and state. Once per domain and reason; Hypervisor.Unparsable lists
	// all of them.
	Unparsable *UnparsableDomain
}

// subscribers fans events out to every subscriber. A subscriber that does
// not keep up loses events rather than stalling the cache. The cache is
// updated before an event is published, so a consumer that re-reads the
// cache on any event it does get (as placement does) misses no change.
type subscribers struct {
	mu   sync.Mutex
	next int
	subs map[int]chan Event
}

// subscriberBuffer is each channel's depth: events of a resync of 1000
// changed domains fit, and a deeper one costs the idle CCM heap.
const subscriberBuffer = 1024

func (s *subscribers) subscribe() (<-chan Event, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs == nil {
		s.subs = map[int]chan Event{}
	}
	id := s.next
	s.next++
	ch := make(chan Event, subscriberBuffer)
	s.subs[id] = ch
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c, ok := s.subs[id]; ok {
			delete(s.subs, id)
			close(c)
		}
	}
}

func (s *subscribers) publish(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.subs {
		select {
		case ch <- e:
		default:
		}
	}
}
