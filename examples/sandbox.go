package examples

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// Sandbox is the part of the unit's confinement that a process started
// without systemd can be given too: its capabilities and no new
// privileges. The lab and the tests start the CCM inside it, so that
// anything needing more privilege than the unit grants fails there first.
// The rest (the system-call filter, W^X memory, /proc hidden, the file
// system read-only, MemoryMax and TasksMax) only systemd applies: the
// e2e test TestDebUnderSystemd runs the CCM under the unit itself.
type Sandbox struct {
	// Bounding is CapabilityBoundingSet, e.g. CAP_NET_ADMIN.
	Bounding []string
	// Ambient is AmbientCapabilities.
	Ambient         []string
	NoNewPrivileges bool
}

// UnitSandbox reads the confinement of a systemd unit's [Service] section.
// A unit without CapabilityBoundingSet would run the CCM with every
// capability: that is an error, not a sandbox.
func UnitSandbox(unit []byte) (Sandbox, error) {
	var s Sandbox
	bounded := false
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(key, "#") {
			continue
		}
		switch key {
		case "CapabilityBoundingSet":
			s.Bounding, bounded = capabilities(value), true
		case "AmbientCapabilities":
			s.Ambient = capabilities(value)
		case "NoNewPrivileges":
			s.NoNewPrivileges = value == "true" || value == "yes"
		}
	}
	if err := sc.Err(); err != nil {
		return Sandbox{}, err
	}
	if !bounded {
		return Sandbox{}, fmt.Errorf("the unit sets no CapabilityBoundingSet")
	}
	for _, c := range slices.Concat(s.Bounding, s.Ambient) {
		if !strings.HasPrefix(c, "CAP_") || strings.ContainsAny(c, "~ ") {
			return Sandbox{}, fmt.Errorf("capability %q: want names like CAP_NET_ADMIN", c)
		}
	}
	return s, nil
}

func capabilities(value string) []string {
	return strings.Fields(strings.ToUpper(value))
}

// Wrap returns argv run by setpriv(1) with the sandbox's capabilities (as
// systemd gives them to a root service: bounding, inheritable and ambient
// sets) and, if the unit says so, no new privileges.
func (s Sandbox) Wrap(argv []string) []string {
	out := []string{"setpriv",
		"--bounding-set", setprivCaps(s.Bounding),
		"--inh-caps", setprivCaps(s.Ambient),
		"--ambient-caps", setprivCaps(s.Ambient),
	}
	if s.NoNewPrivileges {
		out = append(out, "--no-new-privs")
	}
	return append(append(out, "--"), argv...)
}

// setprivCaps spells caps as setpriv wants them: "-all,+net_admin,+net_raw".
func setprivCaps(caps []string) string {
	var b strings.Builder
	b.WriteString("-all")
	for _, c := range caps {
		b.WriteString(",+")
		b.WriteString(strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	return b.String()
}

// CCMSandbox is the shipped unit's sandbox.
func CCMSandbox() (Sandbox, error) { return UnitSandbox(Unit) }
