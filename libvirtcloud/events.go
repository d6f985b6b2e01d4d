package libvirtcloud

import "sync"

// Event says a domain changed: it appeared, changed state, or (Removed) was
// undefined. Domain is the snapshot after the change (before, if Removed).
type Event struct {
	Domain  Domain
	Removed bool
}

// subscribers fans events out to every subscriber. A subscriber that does
// not keep up loses events rather than stalling the cache; each channel is
// deep enough for a resync of thousands of domains, and consumers are
// expected to re-read the cache periodically anyway.
type subscribers struct {
	mu   sync.Mutex
	next int
	subs map[int]chan Event
}

const subscriberBuffer = 8192

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
