package nodeagent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// ReadHost reads the Host description from a Linux root (normally "/").
// The system UUID is required: without it the cloud-controller-manager
// cannot match the Node to its domain by UUID.
func ReadHost(root string) (Host, error) {
	read := func(p string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, p))
		return strings.TrimSpace(string(b)), err
	}
	var h Host
	var err error
	if h.SystemUUID, err = read("sys/class/dmi/id/product_uuid"); err != nil {
		return Host{}, fmt.Errorf("read system UUID: %w", err)
	}
	h.SystemUUID = strings.ToLower(h.SystemUUID)
	if h.SystemUUID == "" {
		return Host{}, errors.New("read system UUID: /sys/class/dmi/id/product_uuid is empty")
	}
	// The rest is informational.
	h.BootID, _ = read("proc/sys/kernel/random/boot_id")
	h.KernelVersion, _ = read("proc/sys/kernel/osrelease")
	h.MachineID, _ = read("etc/machine-id")
	h.CPUs = runtime.NumCPU()
	if mi, err := os.ReadFile(filepath.Join(root, "proc/meminfo")); err == nil {
		h.MemoryBytes = memTotal(mi)
	}
	return h, nil
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
