package lab

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportDirection: arrows point into lab, never out of it. up,
// chaos, bench and conformance use lab; lab uses host, guest, relay,
// explain and the pieces it runs, and none of them. Those, and lanprobe,
// know nothing of the lab. up brings a lab up and uses none of the commands that work on
// one.
func TestImportDirection(t *testing.T) {
	const mod = "github.com/labcloud/labcloud/"
	users := []string{"lab/chaos", "lab/bench", "lab/conformance"}
	for pkg, forbidden := range map[string][]string{
		"lab":            append([]string{"lab/up"}, users...),
		"lab/up":         users,
		"lab/host":       append([]string{"lab"}, users...),
		"lab/kubeletsim": append([]string{"lab"}, users...),
		"lab/guest":      append([]string{"lab"}, users...),
		"lab/relay":      append([]string{"lab"}, users...),
		"lab/explain":    append([]string{"lab"}, users...),
		"lab/lanprobe":   append([]string{"lab"}, users...),
		"lab/chaos":      {"lab/bench", "lab/conformance"},
		"lab/bench":      {"lab/chaos", "lab/conformance"},
	} {
		out, err := exec.Command("go", "list", "-deps", mod+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed %d packages: %q", pkg, len(deps), deps)
		}
		for _, f := range forbidden {
			for _, d := range deps {
				if d == mod+f {
					t.Errorf("%s imports %s (directly or not); the arrow must point the other way", pkg, f)
				}
			}
		}
	}
}
