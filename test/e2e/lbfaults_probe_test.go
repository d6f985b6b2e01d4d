package e2e

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// arpProbe asks the LAN client for a VIP five times a second, as a client
// would keep resolving it, and counts the answers that did not come or came
// with another MAC than want.
type arpProbe struct {
	mu      sync.Mutex
	sent    int
	missed  int
	wrong   map[string]int // MAC → answers with it
	stop    func()
	stopped chan struct{}
}

func probeARP(t testing.TB, c *lanClient, vip netip.Addr, want net.HardwareAddr) *arpProbe {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &arpProbe{wrong: map[string]int{}, stop: cancel, stopped: make(chan struct{})}
	go func() {
		defer close(p.stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			mac, err := c.Resolve(vip, 180*time.Millisecond)
			p.mu.Lock()
			p.sent++
			switch {
			case err != nil || mac == nil:
				p.missed++
			case mac.String() != want.String():
				p.wrong[mac.String()]++
			}
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(p.end)
	return p
}

// end stops probing and returns (sent, missed, answers with another MAC).
func (p *arpProbe) end() {
	p.stop()
	<-p.stopped
}

func (p *arpProbe) counts() (sent, missed int, wrong map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := map[string]int{}
	for k, v := range p.wrong {
		w[k] = v
	}
	return p.sent, p.missed, w
}
