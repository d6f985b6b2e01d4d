package bench

import (
	"testing"

	"github.com/labcloud/labcloud/lab"
)

func TestUpSeconds(t *testing.T) {
	steps := []lab.Step{
		{Name: "control-plane tools", Seconds: 100}, {Name: "build CCM and lab-node", Seconds: 50},
		{Name: "claim the host's libvirtd", Seconds: 30}, {Name: "libvirtd", Seconds: 1},
		{Name: "boot 2 guests", Seconds: 4}, {Name: lab.FirstAnswerStep, Seconds: 20}, {Name: "after", Seconds: 2},
	}
	if total, first := upSeconds(steps); total != 27 || first != 25 {
		t.Errorf("upSeconds = %v, %v; want 27 (no tools, builds or waits) and 25", total, first)
	}
	if _, first := upSeconds(steps[:5]); first != 0 {
		t.Errorf("up that never answered: first answer at %v, want 0", first)
	}
}
