package announce

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Run answers ARP requests and Neighbor Solicitations for owned VIPs and
// sends the announcements that Set, start-up, the bridge coming back up and
// the refresh timer call for,
// until ctx is done. Everything it starts has stopped when it returns. It may
// be called once.
func (a *Announcer) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("announce: Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("bridge", a.name)
	ctx = klog.NewContext(ctx, logger)

	var linkUp <-chan int
	if a.opts.Links != nil {
		ch, err := a.opts.Links.WatchUp(ctx, a.name)
		if err != nil {
			close(a.readerDone)
			return err
		}
		linkUp = ch
	}

	var wg, readers sync.WaitGroup
	nd := make([]byte, maxNDFrame) // the ND reader's buffer
	for proto, read := range map[string]func(*incarnation) error{
		"ARP": func(b *incarnation) error { return a.readARP(ctx, b) },
		"NDP": func(b *incarnation) error { return a.readND(ctx, b, nd) },
	} {
		readers.Go(func() { a.readLoop(ctx, proto, read) })
	}
	wg.Add(2)
	go func() {
		// Unblock the readers once ctx is done, on whichever connections
		// they read by then.
		defer wg.Done()
		<-ctx.Done()
		for {
			b := a.bridge.Load()
			for _, c := range []interface{ SetReadDeadline(time.Time) error }{b.ARP, b.ND} {
				if err := c.SetReadDeadline(time.Now()); err != nil {
					logger.V(2).Info("Could not interrupt a reader", "err", err)
				}
			}
			select {
			case <-a.readerDone:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	go func() {
		readers.Wait()
		close(a.readerDone)
	}()
	go func() {
		defer wg.Done()
		a.announceLoop(ctx, linkUp)
	}()
	close(a.started)
	logger.V(2).Info("Announcing VIPs")
	wg.Wait()
	<-a.readerDone
	if linkUp != nil {
		for range linkUp {
			// The watcher closes it once it has stopped.
		}
	}
	return nil
}

// announceLoop sends gratuitous ARP rounds as they fall due, re-arms every VIP
// when the link comes back up, and refreshes slowly. It owns the schedule.
func (a *Announcer) announceLoop(ctx context.Context, linkUp <-chan int) {
	logger := klog.FromContext(ctx)
	var retry <-chan time.Time // rebinding to a re-created bridge failed
	var refresh <-chan time.Time
	if a.opts.Refresh > 0 {
		t := time.NewTicker(a.opts.Refresh)
		defer t.Stop()
		refresh = t.C
	}
	sched := newSchedule()
	// After the bridge was down or re-created: the kernel flushed its
	// neighbour entries, and announcements sent meanwhile were lost.
	reannounce := func() {
		a.resync(ctx)
		sched.rearm(a.vips.Load(), a.opts.Count)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := a.sendDue(ctx, sched, time.Now())
		var due <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-due:
		case <-refresh:
			sched.rearm(a.vips.Load(), 1)
			a.resync(ctx)
		case index, ok := <-linkUp:
			if !ok {
				linkUp = nil
				continue
			}
			retry = nil
			if err := a.rebind(ctx, index); err != nil {
				logger.Error(err, "Bridge re-created; cannot bind to it yet, retrying")
				retry = time.After(200 * time.Millisecond)
				continue
			}
			logger.Info("Bridge is up again; re-announcing every VIP", "index", index)
			reannounce()
		case <-retry:
			retry = nil
			if err := a.rebind(ctx, -1); err != nil {
				retry = time.After(200 * time.Millisecond)
				continue
			}
			logger.Info("Bound to the re-created bridge; re-announcing every VIP")
			reannounce()
		}
		timer.Stop()
	}
}

// rebind moves to the bridge's incarnation with this index (-1: look it
// up), when the bridge was deleted and created again under its name: a new
// socket, and the neighbour entries and announcements follow on the new
// index. The same index (the bridge only went down and up) keeps everything.
func (a *Announcer) rebind(ctx context.Context, index int) error {
	cur := a.bridge.Load().index
	if cur == index || a.opts.Reopen == nil {
		return nil
	}
	ifi, conns, err := a.opts.Reopen(a.name)
	if err != nil {
		return err
	}
	if ifi.Index == cur {
		return conns.close()
	}
	old := a.bridge.Swap(&incarnation{index: ifi.Index, mac: bytes.Clone(ifi.HardwareAddr), Conns: conns})
	if ctx.Err() != nil {
		_ = conns.ARP.SetReadDeadline(time.Now())
		_ = conns.ND.SetReadDeadline(time.Now())
	}
	_ = old.close() // the readers move to the new sockets
	a.forget()
	return nil
}
