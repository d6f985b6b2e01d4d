package systemdroot

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

const cgroupDir = "/sys/fs/cgroup"

// mountHostCgroups gives a process that `ip netns exec` runs the cgroup file
// systems nspawn needs: ip mounts a fresh sysfs on /sys without them. It
// mounts the hierarchies PID 1 has under /sys/fs/cgroup again, in this
// process's own mount namespace (PID 1 has them, this process does not: the
// namespaces differ); the host's is not touched.
func mountHostCgroups() error {
	// Mounted here already, or not by PID 1 either: nothing to copy.
	if mps, err := MountsUnder(cgroupDir); err != nil || len(mps) > 0 {
		return err
	}
	f, err := os.Open("/proc/1/mountinfo")
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok := parseMountinfo(sc.Text())
		if !ok || (m.point != cgroupDir && !strings.HasPrefix(m.point, cgroupDir+"/")) {
			continue
		}
		if m.root != "/" {
			return fmt.Errorf("cgroups: PID 1 has a part of a file system on %s (%s), not a whole one", m.point, m.root)
		}
		// Parents come before their children in mountinfo; the children's
		// mount points are made in the parent's fresh tmpfs.
		if err := os.MkdirAll(m.point, 0o755); err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		if err := unix.Mount(m.source, m.point, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("cgroups: mount %s %s (%s): %w", m.fstype, m.point, m.data, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	return nil
}

type mountEntry struct {
	root, point, fstype, source, data string
	flags                             uintptr
}

// parseMountinfo reads one line of /proc/PID/mountinfo: "ID PARENT MAJ:MIN
// ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS".
func parseMountinfo(line string) (mountEntry, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	f, g := strings.Fields(pre), strings.Fields(post)
	if !ok || len(f) < 6 || len(g) < 3 {
		return mountEntry{}, false
	}
	m := mountEntry{root: unescapeMount(f[3]), point: unescapeMount(f[4]), fstype: g[0], source: g[1]}
	for _, o := range strings.Split(f[5], ",") {
		switch o {
		case "ro":
			m.flags |= unix.MS_RDONLY
		case "nosuid":
			m.flags |= unix.MS_NOSUID
		case "nodev":
			m.flags |= unix.MS_NODEV
		case "noexec":
			m.flags |= unix.MS_NOEXEC
		}
	}
	var data []string
	for _, o := range strings.Split(g[2], ",") {
		if o != "rw" && o != "ro" {
			data = append(data, o)
		}
	}
	m.data = strings.Join(data, ",")
	return m, true
}
