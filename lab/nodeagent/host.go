package nodeagent

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// ReadHost reads the Host description from a Linux root (normally "/").
// Nothing is required: a field that cannot be read stays empty. Without a
// system UUID (QEMU started without -uuid has none; libvirt always sets
// one) the cloud-controller-manager matches the Node by name instead.
func ReadHost(root string) Host {
	read := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(root, p))
		return strings.TrimSpace(string(b))
	}
	h := Host{
		SystemUUID:    strings.ToLower(read("sys/class/dmi/id/product_uuid")),
		BootID:        read("proc/sys/kernel/random/boot_id"),
		KernelVersion: read("proc/sys/kernel/osrelease"),
		MachineID:     read("etc/machine-id"),
		CPUs:          runtime.NumCPU(),
	}
	if mi, err := os.ReadFile(filepath.Join(root, "proc/meminfo")); err == nil {
		h.MemoryBytes = memTotal(mi)
	}
	return h
}

// memTotal parses MemTotal (kB) from /proc/meminfo.
func memTotal(meminfo []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
