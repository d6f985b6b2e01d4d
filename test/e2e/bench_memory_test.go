package e2e

import (
	"crypto/tls"
	"debug/elf"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// BenchmarkCCMMemory: the CCM as shipped (every controller, routes and
// load balancers on the e2e bridge) with 1000 Nodes and then 1000
// LoadBalancer Services, all initialized, routed where
// kube-controller-manager could give a pod CIDR (its /16 holds 256 /24s)
// and announced. It reports the CCM's resident memory split as the kernel
// counts it: anonymous (what the process allocated: Go heap and stacks,
// libvirt's C allocations; the 1000 domains live in the e2e libvirtd's test
// driver, reached as test+unix://, as a hypervisor's live in libvirtd) and
// file-backed (pages of the binary and its libraries), at idle (connected,
// informers synced, no Node) and their peaks over the whole run, with the
// kernel's peak of the sum (VmHWM). The binary is read from disk, as an
// installed CCM's is. LABCLOUD_BENCH_PROFILE_DIR saves the
// CCM's memory map and heap profile at the end.
func BenchmarkCCMMemory(b *testing.B) { benchCCMMemory(b, 1) }

// BenchmarkCCMMemoryTwoHosts is BenchmarkCCMMemory with the 1000 domains
// on two hypervisor hosts, 500 each: the CCM holds a connection, a domain
// cache and a zone per host.
func BenchmarkCCMMemoryTwoHosts(b *testing.B) { benchCCMMemory(b, 2) }

func benchCCMMemory(b *testing.B, hosts int) {
	requireEnv(b)
	const nodes, services = 1000, 1000
	f := newFleetOnHosts(b, "mem", nodes, hosts)
	readFromDisk(b, env.ccmBin)
	ccm := startCCMWithEnv(b, os.Getenv("LABCLOUD_BENCH_CCM_ENV"), f.cloudConfig())
	servicesGoneAtEnd(b, "mem-")
	mem := sampleMem(b, ccm.proc.Pid())
	waitLog(b, ccm, "Successfully acquired lease", 60*time.Second)
	time.Sleep(3 * time.Second) // informers synced, hypervisor listed
	idle, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := cpuTicks(b, ccm.proc.Pid())
	alloc0 := ccmMetric(b, ccm, "go_memstats_alloc_bytes_total")

	start := time.Now()
	f.register(b, 20*time.Second, 3*time.Minute)
	b.Logf("%d Nodes initialized in %s", nodes, time.Since(start).Round(time.Millisecond))
	nodesPeak := mem.phasePeaks()
	passes0 := placementPasses(b, ccm)
	start = time.Now()
	createServices(b, "mem", services, 3*time.Minute)
	b.Logf("%d Services announced in %s", services, time.Since(start).Round(time.Millisecond))
	// Each pass places every VIP: how many the burst took drives what it
	// allocates.
	b.ReportMetric(placementPasses(b, ccm)-passes0, "services-placement-passes")
	time.Sleep(5 * time.Second) // events flushed, placement settled
	end, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	// What the work cost the CCM (the GC's share included), in CPU seconds.
	b.ReportMetric(float64(cpuTicks(b, ccm.proc.Pid())-cpu0)/100, "cpu-s")
	// What the Go heap allocated for it: the rate the GC keeps up with.
	b.ReportMetric((ccmMetric(b, ccm, "go_memstats_alloc_bytes_total")-alloc0)/1e9, "alloc-GB")
	if dir := os.Getenv("LABCLOUD_BENCH_PROFILE_DIR"); dir != "" {
		saveProfiles(b, ccm, dir, "mem-end")
	}
	peak, servicesPeak := mem.peaks(), mem.phasePeaks()
	b.ReportMetric(mib(idle.anon), "idle-anon-MiB")
	b.ReportMetric(mib(idle.file), "idle-file-MiB")
	b.ReportMetric(mib(peak.anon), "peak-anon-MiB")
	b.ReportMetric(mib(peak.file), "peak-file-MiB")
	// Which burst the peak belongs to.
	b.ReportMetric(mib(nodesPeak.anon), "nodes-peak-anon-MiB")
	b.ReportMetric(mib(servicesPeak.anon), "services-peak-anon-MiB")
	b.ReportMetric(mib(max(peak.hwm, end.hwm)), "peak-rss-MiB")
	b.ReportMetric(mib(end.anon), "end-anon-MiB")
	b.ReportMetric(mib(end.file), "end-file-MiB")
	pmd, err := filePmdMapped(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(mib(pmd), "end-file-pmd-MiB")
	bin, err := elf.Open(env.ccmBin)
	if err != nil {
		b.Fatal(err)
	}
	defer bin.Close()
	b.ReportMetric(mib(readOnlyLoadSize(b, bin)), "binary-ro-MiB")

	// Which of the file-backed pages the CCM uses: the kernel takes back
	// every page of its binary and libraries, and the CCM, left at steady
	// state (routes reconciled every 2 s, Leases renewed), faults back in
	// what it runs. The rest were start-up's and readahead's.
	mem.stop()
	if err := pageOutFileMappings(ccm.proc.Pid()); err != nil {
		b.Fatal(err)
	}
	trimmed, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(steadyFileWindow)
	steady, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	if steady.file <= trimmed.file {
		b.Fatalf("the CCM faulted nothing back in %s after its file pages were taken back (file-backed %d then %d bytes): the page-out did not take or the CCM stalled", steadyFileWindow, trimmed.file, steady.file)
	}
	b.ReportMetric(mib(trimmed.file), "paged-out-file-MiB")
	b.ReportMetric(mib(steady.file), "steady-file-MiB")
}

// readFromDisk drops path from the page cache, so that the process started
// next reads it from disk, as an installed daemon's binary is after a boot.
// The page cache holds a file in folios as large as the I/O that brought it
// in, and the kernel maps a whole folio at a fault: the Go linker writes
// its output through a mapping, in 2 MiB folios, and started straight from
// it the CCM maps 59 MiB of files where, read from disk or just unpacked
// from the .deb by dpkg, it maps 50.
func readFromDisk(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // only clean pages can be dropped
		b.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	pages := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&pages[0]))); e != 0 {
		b.Fatalf("mincore %s: %v", path, e)
	}
	resident := 0
	for _, p := range pages {
		resident += int(p & 1)
	}
	if resident > len(pages)/20 {
		b.Fatalf("%s: %d of %d pages still in the page cache after POSIX_FADV_DONTNEED (is a process running it?)", path, resident, len(pages))
	}
}

// filePmdMapped is how much of process pid's file-backed memory is mapped
// in 2 MiB pieces (FilePmdMapped): pages of page-cache folios that large,
// which the kernel maps whole at a fault. A binary the Go linker has just
// written is cached in such folios; one read back from disk is not, so the
// file-backed figure depends on how the binary came into the page cache.
func filePmdMapped(pid int) (int64, error) {
	// procfs's smaps_rollup reading leaves this line out.
	path := fmt.Sprintf("/proc/%d/smaps_rollup", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "FilePmdMapped:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: FilePmdMapped %q: %w", path, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no FilePmdMapped line", path)
}

// steadyFileWindow is how long the CCM runs at steady state before the
// file-backed pages it faulted back in are counted.
const steadyFileWindow = 60 * time.Second

// pageOutFileMappings asks the kernel to reclaim every file-backed page
// mapped by process pid (process_madvise MADV_PAGEOUT): clean pages of the
// binary and its libraries are dropped and read again when next touched.
func pageOutFileMappings(pid int) error {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return err
	}
	maps, err := proc.ProcMaps()
	if err != nil {
		return err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	for _, m := range maps {
		if !strings.HasPrefix(m.Pathname, "/") { // file mappings have a path
			continue
		}
		// struct iovec naming a range of the other process's memory, which
		// this one never dereferences (so not a Go pointer).
		iov := [2]uintptr{m.StartAddr, m.EndAddr - m.StartAddr}
		if _, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd), uintptr(unsafe.Pointer(&iov)), 1, unix.MADV_PAGEOUT, 0, 0); errno != 0 {
			return fmt.Errorf("process_madvise MADV_PAGEOUT %x-%x %s: %w", m.StartAddr, m.EndAddr, m.Pathname, errno)
		}
	}
	return nil
}

// startCCMWithEnv starts the CCM with extra environment variables, given
// as "K=V,K=V" (LABCLOUD_BENCH_CCM_ENV, e.g. GOGC=50 or GOMEMLIMIT=64MiB to
// measure the Go runtime's knobs), set for that process only.
func startCCMWithEnv(b *testing.B, extra, cloudConfig string) *ccm {
	for _, kv := range strings.Split(extra, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		old, had := os.LookupEnv(k)
		if err := os.Setenv(k, v); err != nil {
			b.Fatal(err)
		}
		defer func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		}()
		b.Logf("the CCM runs with %s=%s", k, v)
	}
	return startCCM(b, cloudConfig)
}

// saveProfiles writes the CCM's memory map (/proc/PID/smaps) and its Go
// heap profile with runtime.MemStats (/debug/pprof/heap, read as a cluster
// admin through the secure port) into dir, for LABCLOUD_BENCH_PROFILE_DIR.
func saveProfiles(tb testing.TB, c *ccm, dir, name string) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", c.proc.Pid()))
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".smaps"), smaps, 0o644); err != nil {
		tb.Fatal(err)
	}
	token := adminToken(tb)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the CCM's self-signed certificate
	for file, path := range map[string]string{name + ".heap.pb.gz": "/debug/pprof/heap", name + ".heap.txt": "/debug/pprof/heap?debug=1"} {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.securePort, path), nil)
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			tb.Errorf("%s: %v", path, err)
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			tb.Errorf("%s: %d %v", path, resp.StatusCode, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Logf("profiles of the CCM in %s", dir)
}

// readOnlyLoadSize is how much of an executable the loader maps without
// write permission: its text and read-only data, what the process's
// file-backed memory can grow to from the binary itself.
func readOnlyLoadSize(t testing.TB, f *elf.File) int64 {
	var n int64
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_W == 0 {
			n += int64(p.Filesz)
		}
	}
	if n == 0 {
		t.Fatal("the binary has no read-only loadable segment")
	}
	return n
}
