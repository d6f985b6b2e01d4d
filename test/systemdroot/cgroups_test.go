package systemdroot

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	for _, tt := range []struct {
		line string
		want mountEntry
		ok   bool
	}{
		{"31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755",
			mountEntry{root: "/", point: "/sys/fs/cgroup", fstype: "tmpfs", source: "tmpfs", data: "mode=755", flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC}, true},
		{"40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd",
			mountEntry{root: "/", point: "/sys/fs/cgroup/systemd", fstype: "cgroup", source: "cgroup", data: "xattr,name=systemd"}, true},
		{"41 31 0:38 /a\\040b /mnt/x\\040y rw - cgroup2 cgroup2 rw",
			mountEntry{root: "/a b", point: "/mnt/x y", fstype: "cgroup2", source: "cgroup2"}, true},
		{"41 31 0:38 / /mnt rw", mountEntry{}, false},
	} {
		got, ok := parseMountinfo(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("%q:\n got %+v, %v\nwant %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}
