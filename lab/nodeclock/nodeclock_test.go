package nodeclock

import (
	"testing"
	"time"
)

// A clock that agrees with the RTC to within its whole seconds is left
// alone; one an hour behind (a snapshot restored an hour later) or a
// minute ahead is stepped to it.
func TestStep(t *testing.T) {
	now := time.Date(2026, 11, 29, 13, 0, 0, 700e6, time.UTC)
	for _, tt := range []struct {
		rtc  time.Time
		want time.Duration
	}{
		{now.Truncate(time.Second), 0},
		{now.Truncate(time.Second).Add(time.Second), 0},
		{now.Truncate(time.Second).Add(-2 * time.Second), 0},
		{now.Truncate(time.Second).Add(time.Hour), time.Hour},
		{now.Truncate(time.Second).Add(-time.Minute), -time.Minute},
	} {
		if got := Step(now, tt.rtc); got != tt.want {
			t.Errorf("Step(%s, rtc %s) = %s, want %s", now.Format(time.StampMilli), tt.rtc.Format(time.Stamp), got, tt.want)
		}
	}
}
