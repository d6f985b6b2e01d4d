package libvirtcloud

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics/testutil"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/metrics"
)

// openFixture opens the test-driver fixture with several domains: running,
// shut off, crashed, without interfaces, with an instance-type override.
func openFixture(t *testing.T, opts Options) *Hypervisor {
	t.Helper()
	return openFixtureCtx(t, context.Background(), opts)
}

// openFixtureCtx is openFixture with a parent context, e.g. to log.
func openFixtureCtx(t *testing.T, parent context.Context, opts Options) *Hypervisor {
	t.Helper()
	path, err := filepath.Abs("testdata/hosts.xml")
	if err != nil {
		t.Fatal(err)
	}
	if opts.URI == "" {
		opts.URI = "test://" + path
	}
	if opts.Zone == "" {
		opts.Zone = "zone-a"
	}
	ctx, cancel := context.WithCancel(parent)
	t.Cleanup(cancel)
	h, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Later tests count libvirt calls process-wide: this hypervisor's
	// goroutine must be gone when the test ends.
	t.Cleanup(func() { cancel(); <-h.stopped })
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := h.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCacheHoldsEveryDomain(t *testing.T) {
	h := openFixture(t, Options{})
	want := map[string]struct {
		state  State
		vcpus  int
		memKiB uint64
		macs   int
		itype  string
	}{
		"node-a":       {StateRunning, 1, 1 << 20, 1, ""},
		"node-b":       {StateRunning, 2, 4 << 20, 1, ""},
		"node-off":     {StateShutOff, 1, 512 << 10, 1, ""},
		"node-crashed": {StateCrashed, 1, 512 << 10, 1, ""},
		"node-noif":    {StateRunning, 4, 8 << 20, 0, ""},
		"node-typed":   {StateRunning, 8, 16 << 20, 1, "gpu-large"},
	}
	got := h.Domains()
	if len(got) != len(want) {
		t.Fatalf("cached %d domains, want %d", len(got), len(want))
	}
	for _, d := range got {
		w, ok := want[d.Name]
		if !ok {
			t.Errorf("unexpected domain %q", d.Name)
			continue
		}
		if d.State != w.state || d.VCPUs != w.vcpus || d.MemoryKiB != w.memKiB || len(d.Interfaces) != w.macs || d.InstanceType != w.itype {
			t.Errorf("%s = %+v, want %+v", d.Name, d, w)
		}
		if d.Hypervisor != "zone-a" || d.Type != "test" {
			t.Errorf("%s: hypervisor %q type %q", d.Name, d.Hypervisor, d.Type)
		}
		for _, i := range d.Interfaces {
			if i.Network != "labnet" {
				t.Errorf("%s: interface %+v not on labnet", d.Name, i)
			}
		}
	}
}

func TestLookups(t *testing.T) {
	h := openFixture(t, Options{})
	d, err := h.DomainByUUID("22222222-2222-2222-2222-222222222222")
	if err != nil || d.Name != "node-b" {
		t.Fatalf("by uuid: %+v, %v", d, err)
	}
	d, err = h.DomainByUUID(strings.ToUpper("22222222-2222-2222-2222-222222222222"))
	if err != nil || d.Name != "node-b" {
		t.Fatalf("by upper-case uuid: %+v, %v", d, err)
	}
	d, err = h.DomainByName("node-off")
	if err != nil || d.State != StateShutOff {
		t.Fatalf("by name: %+v, %v", d, err)
	}
	_, err = h.DomainByUUID("99999999-9999-9999-9999-999999999999")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing uuid: err = %v, want ErrNotFound", err)
	}
	_, err = h.DomainByName("no-such-node")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing name: err = %v, want ErrNotFound", err)
	}
}

func TestSteadyStateLookupsCostNoLibvirtCalls(t *testing.T) {
	h := openFixture(t, Options{ReadWrite: true, Sources: []AddressSource{SourceDHCPLeases, SourceGuestAgent}})
	ctx := context.Background()
	round := func() {
		for _, name := range []string{"node-a", "node-b", "node-typed"} {
			d, err := h.DomainByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.DomainByUUID(d.UUID); err != nil {
				t.Fatal(err)
			}
			addrs, err := h.Addresses(ctx, d)
			if err != nil || len(addrs) == 0 {
				t.Fatalf("addresses of %s: %v, %v", name, addrs, err)
			}
		}
	}
	round() // warms the agent cache
	before := h.Calls()
	round()
	if n := h.Calls() - before; n != 0 {
		t.Fatalf("steady-state lookups made %d libvirt calls, want 0", n)
	}
}

func TestAddressSources(t *testing.T) {
	ctx := context.Background()
	neigh := func() (map[string][]netip.Addr, error) {
		return map[string][]netip.Addr{"52:54:00:00:00:0b": {netip.MustParseAddr("10.77.0.42")}}, nil
	}
	t.Run("agent", func(t *testing.T) {
		h := openFixture(t, Options{ReadWrite: true, Sources: []AddressSource{SourceDHCPLeases, SourceGuestAgent}})
		d, _ := h.DomainByName("node-a")
		addrs, err := h.Addresses(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		// The test driver's agent answers with an address from labnet's DHCP range.
		if len(addrs) != 1 || !netip.MustParsePrefix("10.77.0.0/24").Contains(addrs[0]) {
			t.Fatalf("addresses = %v, want one in 10.77.0.0/24", addrs)
		}
		if found, err := h.DomainByAddress(ctx, addrs[0]); err != nil || found.Name != "node-a" {
			t.Fatalf("DomainByAddress(%v) = %v, %v", addrs[0], found.Name, err)
		}
	})
	t.Run("agent on a shut-off domain is no address, not an error", func(t *testing.T) {
		h := openFixture(t, Options{ReadWrite: true, Sources: []AddressSource{SourceGuestAgent}})
		d, _ := h.DomainByName("node-off")
		addrs, err := h.Addresses(ctx, d)
		if err != nil || len(addrs) != 0 {
			t.Fatalf("addresses = %v, %v; want none, nil", addrs, err)
		}
	})
	t.Run("arp table after leases", func(t *testing.T) {
		h := openFixture(t, Options{Sources: []AddressSource{SourceDHCPLeases, SourceARP}, Neighbours: neigh})
		d, _ := h.DomainByName("node-b")
		addrs, err := h.Addresses(ctx, d)
		if err != nil || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("10.77.0.42")}) {
			t.Fatalf("addresses = %v, %v", addrs, err)
		}
		d, _ = h.DomainByName("node-noif")
		if addrs, err := h.Addresses(ctx, d); err != nil || len(addrs) != 0 {
			t.Fatalf("domain without interfaces: %v, %v", addrs, err)
		}
	})
	t.Run("read-only connection has no agent", func(t *testing.T) {
		h := openFixture(t, Options{Sources: []AddressSource{SourceGuestAgent}})
		d, _ := h.DomainByName("node-a")
		addrs, err := h.Addresses(ctx, d)
		if err != nil || len(addrs) != 0 {
			t.Fatalf("addresses = %v, %v; want none, nil", addrs, err)
		}
	})
}

func TestUnreachableHypervisorIsAnErrorNotNotFound(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h, err := Open(ctx, Options{URI: "qemu+unix:///system?socket=" + filepath.Join(t.TempDir(), "no-libvirtd"), Zone: "down"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); <-h.stopped }()
	for _, lookup := range []func() error{
		func() error { _, err := h.DomainByUUID("11111111-1111-1111-1111-111111111111"); return err },
		func() error { _, err := h.DomainByName("node-a"); return err },
	} {
		err := lookup()
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
			t.Fatalf("err = %v, want ErrUnavailable and not ErrNotFound", err)
		}
	}
}

// The test driver's default instance is shared by every connection in the
// process, so a read-write connection here drives the events that the
// read-only Hypervisor must see.
func TestLifecycleEventsUpdateCacheAndSubscribers(t *testing.T) {
	metrics.Register()
	h := openFixture(t, Options{URI: "test:///default", Zone: "events-zone"})
	cached := func() float64 {
		t.Helper()
		v, err := testutil.GetGaugeMetricValue(metrics.LibvirtDomains.WithLabelValues("events-zone"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := cached(); got != 1 {
		t.Fatalf("cached domains %v, want test:///default's one", got)
	}
	events, stop := h.Subscribe()
	defer stop()
	admin, err := libvirt.NewConnect("test:///default")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	dom, err := admin.LookupDomainByName("test")
	if err != nil {
		t.Fatal(err)
	}
	defer dom.Free()
	uuid, _ := dom.GetUUIDString()

	wait := func(what string, match func(Event) bool) {
		t.Helper()
		waitEvent(t, events, what, func(e Event) bool { return e.Domain.UUID == uuid && match(e) })
	}
	before := time.Now()
	if err := dom.Destroy(); err != nil {
		t.Fatal(err)
	}
	wait("stopped", func(e Event) bool { return !e.Removed && e.Domain.State == StateShutOff })
	d, err := h.DomainByUUID(uuid)
	if err != nil || d.State != StateShutOff {
		t.Fatalf("after stop: %+v, %v", d, err)
	}
	if d.DownEventAt.Before(before) || d.DownEventAt.After(time.Now()) {
		t.Errorf("DownEventAt = %v, want the stop event's arrival (after %v)", d.DownEventAt, before)
	}
	if err := dom.Create(); err != nil {
		t.Fatal(err)
	}
	wait("started", func(e Event) bool { return e.Domain.State == StateRunning })
	if d, err := h.DomainByUUID(uuid); err != nil || !d.DownEventAt.IsZero() {
		t.Errorf("running again: DownEventAt = %v (%v), want zero", d.DownEventAt, err)
	}
	if err := dom.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := dom.Undefine(); err != nil {
		t.Fatal(err)
	}
	wait("removed", func(e Event) bool { return e.Removed })
	if _, err := h.DomainByUUID(uuid); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after undefine: err = %v, want ErrNotFound", err)
	}
	if got := cached(); got != 0 {
		t.Errorf("cached domains %v after the undefine, want 0", got)
	}
}

// QEMU reports a destroyed or killed domain first with a SHUTDOWN event,
// which implies no state: the refresh that follows finds it shut off, and
// the time of the event is kept as when it went down.
func TestStateFoundDownAfterAnEventKeepsTheEventTime(t *testing.T) {
	path, err := filepath.Abs("testdata/hosts.xml")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := libvirt.NewConnect("test://" + path) // a private instance
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	h := newHypervisor(ctx, Options{URI: "test://" + path, Zone: "zone-a", Neighbours: noNeighbours})
	if err := h.resync(ctx, conn, true); err != nil {
		t.Fatal(err)
	}
	cached := func(name string) Domain { // the cache, without a live connection
		t.Helper()
		for _, d := range h.Domains() {
			if d.Name == name {
				return d
			}
		}
		t.Fatalf("%s not cached", name)
		return Domain{}
	}
	d := cached("node-a")
	if d.State != StateRunning {
		t.Fatalf("node-a is %s, want running", d.State)
	}
	dom, err := conn.LookupDomainByUUIDString(d.UUID)
	if err != nil {
		t.Fatal(err)
	}
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Millisecond)
	h.apply(ctx, conn, rawEvent{uuid: d.UUID, event: libvirt.DOMAIN_EVENT_SHUTDOWN, at: at})
	got := cached("node-a")
	if got.State != StateShutOff || !got.DownEventAt.Equal(at) {
		t.Fatalf("after SHUTDOWN and a refresh: state %s, DownEventAt %v; want shut-off at %v", got.State, got.DownEventAt, at)
	}
	// The STOPPED event that follows changes nothing.
	h.apply(ctx, conn, rawEvent{uuid: d.UUID, event: libvirt.DOMAIN_EVENT_STOPPED, at: time.Now()})
	got = cached("node-a")
	if !got.DownEventAt.Equal(at) {
		t.Errorf("the later STOPPED event moved DownEventAt to %v, want %v", got.DownEventAt, at)
	}
}

func noNeighbours() (map[string][]netip.Addr, error) { return nil, nil }

// The periodic resync lists every domain's state in one call and re-reads
// only the definitions of domains whose state it did not expect; a full
// one (new connection, lost events) re-reads them all.
func TestPeriodicResyncRereadsOnlyWhatChanged(t *testing.T) {
	h := openFixture(t, Options{})
	ctx := context.Background()
	cost := func(f func(*libvirt.Connect) error) uint64 {
		t.Helper()
		before := h.Calls()
		if err := h.withConn(f); err != nil {
			t.Fatal(err)
		}
		return h.Calls() - before
	}
	leases := cost(func(c *libvirt.Connect) error { _, err := h.readLeases(c); return err })
	resync := func(full bool) func(*libvirt.Connect) error {
		return func(c *libvirt.Connect) error { return h.resync(ctx, c, full) }
	}
	if n := cost(resync(false)); n != 1+leases {
		t.Errorf("a resync of an unchanged host made %d calls, want 1 listing + %d for the leases", n, leases)
	}

	// An event that was missed: the cache says node-a is shut off.
	events, stop := h.Subscribe()
	defer stop()
	d, err := h.DomainByName("node-a")
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	wrong := d
	wrong.State = StateShutOff
	h.domains.put(wrong)
	h.mu.Unlock()
	if n := cost(resync(false)); n != 1+1+leases {
		t.Errorf("a resync with one domain changed made %d calls, want 1 listing + 1 definition + %d for the leases", n, leases)
	}
	if d, _ := h.DomainByName("node-a"); d.State != StateRunning {
		t.Errorf("node-a after the resync: %v, want running", d.State)
	}
	select {
	case e := <-events:
		if e.Domain.Name != "node-a" || e.Domain.State != StateRunning {
			t.Errorf("event %+v, want node-a running", e)
		}
	case <-time.After(time.Second):
		t.Error("the repaired domain was not published")
	}

	domains := uint64(len(h.Domains()))
	if n := cost(resync(true)); n != 1+domains+leases {
		t.Errorf("a full resync made %d calls, want 1 listing + %d definitions + %d for the leases", n, domains, leases)
	}
}
