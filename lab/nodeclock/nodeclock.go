// Package nodeclock keeps a lab node's clock on the host's: a node
// restored from a snapshot resumes with the clock it had when the snapshot
// was taken, and nothing in a guest may believe it is still that time
// (certificates, tokens, leases, kubelet heartbeats). The emulated RTC
// follows the host's clock across a restore, so the node steps its clock
// to the RTC when the two disagree.
package nodeclock

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// tolerance is how far the clock may be from the RTC, which counts whole
// seconds, before it is stepped: a second of reading apart plus one of
// rounding never steps a clock that is right.
const tolerance = 3 * time.Second

// Step is the correction to apply to a clock reading now when the RTC
// reads rtc (whole seconds, UTC), or 0 when none is needed.
func Step(now, rtc time.Time) time.Duration {
	d := rtc.Sub(now.Truncate(time.Second))
	if d < tolerance && d > -tolerance {
		return 0
	}
	return d
}

// Follow reads the RTC at dev every period and steps the clock when Step
// says so, until ctx ends; after a step it calls stepped (the node was
// restored).
func Follow(ctx context.Context, dev string, period time.Duration, stepped func()) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("RTC: %w", err)
	}
	defer f.Close()
	log := klog.FromContext(ctx)
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		did, err := follow(int(f.Fd()), log)
		if err != nil {
			return err
		}
		if did && stepped != nil {
			stepped()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// follow steps the clock to the RTC's if Step says so, and says whether
// it did.
func follow(fd int, log klog.Logger) (bool, error) {
	t, err := unix.IoctlGetRTCTime(fd)
	if err != nil {
		return false, fmt.Errorf("read RTC: %w", err)
	}
	rtc := time.Date(int(t.Year)+1900, time.Month(t.Mon+1), int(t.Mday), int(t.Hour), int(t.Min), int(t.Sec), 0, time.UTC)
	now := time.Now()
	d := Step(now, rtc)
	if d == 0 {
		return false, nil
	}
	tv := unix.NsecToTimeval(now.Add(d).UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return false, fmt.Errorf("step the clock by %s to the RTC's %s: %w", d, rtc.Format(time.RFC3339), err)
	}
	log.Info("Stepped the clock to the RTC (a restored snapshot)", "by", d.Round(time.Millisecond), "rtc", rtc.Format(time.RFC3339))
	return true, nil
}
