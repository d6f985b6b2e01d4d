package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// writeFixture writes a libvirt test-driver fixture with n running domains
// named <prefix>-0000..., each with one NIC.
func writeFixture(t testing.TB, prefix string, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`<node><cpu><mhz>2000</mhz><model>x86_64</model><active>64</active><total>64</total><nodes>1</nodes><sockets>1</sockets><cores>64</cores><threads>1</threads></cpu><memory>1073741824</memory>
<network><name>benchnet</name><uuid>bbbbbbbb-0000-0000-0000-000000000001</uuid><bridge name='benchbr0'/><forward mode='route'/><ip address='10.99.0.1' netmask='255.255.0.0'><dhcp><range start='10.99.0.10' end='10.99.255.250'/></dhcp></ip></network>
`)
	for i := range n {
		fmt.Fprintf(&b, `<domain type='test'><name>%s-%04d</name><uuid>cccccccc-0000-0000-0000-%012d</uuid><memory>2097152</memory><currentMemory>2097152</currentMemory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os><devices><interface type='network'><mac address='52:54:01:%02x:%02x:%02x'/><source network='benchnet'/></interface></devices></domain>
`, prefix, i, i, (i>>16)&0xff, (i>>8)&0xff, i&0xff)
	}
	b.WriteString("</node>\n")
	path := filepath.Join(t.TempDir(), "fixture.xml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// initTimer creates Nodes and records when each loses the uninitialized taint.
type initTimer struct {
	mu      sync.Mutex
	created map[string]time.Time
	done    map[string]time.Duration
	all     chan struct{}
	want    int
}

// watchInit records initialization times through an informer, which
// re-establishes its watch if the API server drops a slow one.
func watchInit(b *testing.B, prefix string, want int) (*initTimer, func()) {
	it := &initTimer{created: map[string]time.Time{}, done: map[string]time.Duration{}, all: make(chan struct{}), want: want}
	observe := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok || !strings.HasPrefix(n.Name, prefix) || hasTaint(n, uninitializedTaint) {
			return
		}
		now := time.Now()
		it.mu.Lock()
		defer it.mu.Unlock()
		if start, ok := it.created[n.Name]; ok {
			if _, seen := it.done[n.Name]; !seen {
				it.done[n.Name] = now.Sub(start)
				if len(it.done) == it.want {
					close(it.all)
				}
			}
		}
	}
	factory := informers.NewSharedInformerFactory(env.admin, 0)
	inf := factory.Core().V1().Nodes().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	return it, func() { close(stop); factory.Shutdown() }
}

func (it *initTimer) create(b *testing.B, name string) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: uninitializedTaint, Value: "true", Effect: v1.TaintEffectNoSchedule}}}}
	it.mu.Lock()
	it.created[name] = time.Now()
	it.mu.Unlock()
	if _, err := env.admin.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		b.Errorf("create %s: %v", name, err)
	}
}

func (it *initTimer) wait(b *testing.B, timeout time.Duration) {
	select {
	case <-it.all:
	case <-time.After(timeout):
		it.mu.Lock()
		defer it.mu.Unlock()
		list, err := env.admin.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		tainted := 0
		if err == nil {
			for i := range list.Items {
				if hasTaint(&list.Items[i], uninitializedTaint) {
					tainted++
				}
			}
		}
		b.Fatalf("%d of %d nodes seen initialized after %s; the API has %d nodes, %d still tainted (%v)", len(it.done), it.want, timeout, len(list.Items), tainted, err)
	}
}

func deleteNodes(b *testing.B) {
	if err := env.admin.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkNodeInitialization: Node created → uninitialized taint removed,
// with the CCM's flags as shipped, against 1000 domains (libvirt's test
// driver, so the figure is the CCM's, not QEMU's).
func BenchmarkNodeInitialization(b *testing.B) {
	requireEnv(b)
	const domains = 1000
	fixture := writeFixture(b, "bench", domains)
	ccm := startCCM(b, fmt.Sprintf("region: bench\nhypervisors: [{uri: 'test://%s', zone: bench}]\naddressSources: [dhcp-leases]\n", fixture))
	deleteNodes(b)
	defer deleteNodes(b)
	time.Sleep(2 * time.Second) // let the CCM sync its informers
	idleRSS, _ := ccm.proc.PeakRSS()
	mem := sampleMem(b, ccm.proc.Pid())

	b.Run("1node", func(b *testing.B) {
		const samples = 20
		var durations []time.Duration
		for i := range samples {
			name := fmt.Sprintf("bench-%04d", i)
			it, stop := watchInit(b, name, 1)
			it.create(b, name)
			it.wait(b, 30*time.Second)
			stop()
			durations = append(durations, it.done[name])
		}
		slices.Sort(durations)
		b.ReportMetric(float64(durations[samples/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(durations[samples*9/10].Microseconds())/1000, "p90-ms")
	})
	deleteNodes(b)
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("%dnodes", n), func(b *testing.B) {
			it, stop := watchInit(b, "bench-", n)
			defer stop()
			start := time.Now()
			createAll(n, func(i int) { it.create(b, fmt.Sprintf("bench-%04d", i)) })
			it.wait(b, 120*time.Second)
			b.ReportMetric(time.Since(start).Seconds(), "all-initialized-s")
			if rss, err := ccm.proc.PeakRSS(); err == nil {
				b.ReportMetric(float64(rss)/(1<<20), "ccm-peak-rss-MB")
				// Before any Node: the binary, libvirt and the in-process
				// test driver holding 1000 domains (in production they live
				// in libvirtd).
				b.ReportMetric(float64(idleRSS)/(1<<20), "ccm-idle-rss-MB")
				// What the CCM itself allocated, without the shared pages of
				// its (70 MB of code) binary and libraries.
				b.ReportMetric(mib(mem.peaks().anon), "ccm-peak-anon-rss-MB")
			}
			deleteNodes(b)
		})
	}
}

// createAll calls create(0..n-1) from 32 goroutines, as a burst of clients
// creating objects at once would, and returns when all calls have.
func createAll(n int, create func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				create(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
