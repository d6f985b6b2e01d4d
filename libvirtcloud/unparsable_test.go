package libvirtcloud

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/component-base/metrics/testutil"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/metrics"
)

const badUUID = "77777777-7777-7777-7777-777777777777"

// badInterface is a NIC libvirt accepts (an unsigned long long) and
// libvirtxml cannot parse (an int).
const badInterface = `<interface type='network'><mac address='52:54:00:00:00:78'/><source network='labnet'/>` +
	`<bandwidth><inbound average='9999999999999999999'/></bandwidth></interface>`

// openUnparsable opens testdata/unparsable.xml: node-a and node-b, and
// node-bad between them, whose definition libvirtxml rejects.
func openUnparsable(t *testing.T, opts Options) (*Hypervisor, *logLines) {
	t.Helper()
	path, err := filepath.Abs("testdata/unparsable.xml")
	if err != nil {
		t.Fatal(err)
	}
	opts.URI = "test://" + path
	logs := &logLines{}
	return openFixtureCtx(t, logr.NewContext(context.Background(), logs.logger()), opts), logs
}

// logLines keeps what is logged, to count messages.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *logLines) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

// waitEvent waits up to 10 s for an event that matches.
func waitEvent(t *testing.T, events <-chan Event, what string, match func(Event) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-events:
			if match(e) {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event within 10s", what)
		}
	}
}

func unparsableGauge(t *testing.T, zone string) float64 {
	t.Helper()
	v, err := testutil.GetGaugeMetricValue(metrics.LibvirtUnparsableDomains.WithLabelValues(zone))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// One domain whose definition cannot be parsed is left out; the rest of
// the hypervisor is served, its lookups say why, and the warning is
// logged once, not on every resync.
func TestUnparsableDomainIsSkipped(t *testing.T) {
	metrics.Register()
	h, logs := openUnparsable(t, Options{Zone: "skip-zone"})
	for _, name := range []string{"node-a", "node-b"} {
		d, err := h.DomainByName(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := h.DomainByUUID(d.UUID); err != nil {
			t.Fatalf("%s by uuid: %v", name, err)
		}
	}
	if n := len(h.Domains()); n != 2 {
		t.Errorf("cached %d domains, want 2", n)
	}

	calls := h.Calls()
	for _, lookup := range []func() (Domain, error){
		func() (Domain, error) { return h.DomainByName("node-bad") },
		func() (Domain, error) { return h.DomainByUUID(strings.ToUpper(badUUID)) },
	} {
		_, err := lookup()
		if !errors.Is(err, ErrUnparsable) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnparsable only", err)
		}
		msg := err.Error()
		for _, want := range []string{`"node-bad"`, badUUID, "cannot be parsed", "9999999999999999999", "out of range"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q does not say %q", msg, want)
			}
		}
		if len(msg) > 400 {
			t.Errorf("error is %d bytes long", len(msg))
		}
	}
	if n := h.Calls() - calls; n != 0 {
		t.Errorf("lookups of a known unparsable domain made %d libvirt calls, want 0", n)
	}
	bad := h.Unparsable()
	if len(bad) != 1 || bad[0].UUID != badUUID || bad[0].Name != "node-bad" || bad[0].Hypervisor != "skip-zone" ||
		bad[0].State != StateShutOff || !strings.Contains(bad[0].Reason, "out of range") || bad[0].Since.IsZero() {
		t.Fatalf("Unparsable() = %+v", bad)
	}
	if got := unparsableGauge(t, "skip-zone"); got != 1 {
		t.Errorf("labcloud_libvirt_unparsable_domains = %v, want 1", got)
	}

	const warning = "Skipping domain whose definition cannot be parsed"
	if n := logs.count(warning); n != 1 || logs.count(`"domain"="node-bad"`) != 1 {
		t.Fatalf("warned %d times (%v), want once naming node-bad", n, logs)
	}
	events, stop := h.Subscribe()
	defer stop()
	ctx := logr.NewContext(context.Background(), logs.logger())
	for _, full := range []bool{false, true, true} {
		if err := h.withConn(func(c *libvirt.Connect) error { return h.resync(ctx, c, full) }); err != nil {
			t.Fatalf("resync (full %v): %v", full, err)
		}
	}
	// Forgotten, and found again by a lookup the cache cannot answer.
	h.mu.Lock()
	delete(h.bad, badUUID)
	h.mu.Unlock()
	if _, err := h.DomainByUUID(badUUID); !errors.Is(err, ErrUnparsable) {
		t.Fatalf("uncached lookup: err = %v, want ErrUnparsable", err)
	}
	if got := h.Unparsable(); len(got) != 1 || !got[0].Since.After(bad[0].Since) {
		t.Errorf("after an uncached lookup: %+v", got)
	}
	if n := logs.count(warning); n != 2 {
		t.Errorf("warned %d times, want once more after the domain was forgotten", n)
	}
	select {
	case e := <-events:
		if e.Unparsable == nil || e.Domain.UUID != badUUID {
			t.Errorf("event %+v, want node-bad unparsable", e)
		}
	case <-time.After(time.Second):
		t.Error("no event for the domain found unparsable again")
	}
	select {
	case e := <-events:
		t.Errorf("unexpected event %+v", e)
	default:
	}
}

// Definitions change with events: a domain defined unparsable is
// reported, one redefined parsable is served again, a cached one that
// turns unparsable leaves the cache without being reported removed, and
// an undefined one is forgotten.
func TestUnparsableDomainFollowsEvents(t *testing.T) {
	metrics.Register()
	h, logs := openUnparsable(t, Options{Zone: "skip-events", ReadWrite: true})
	events, stop := h.Subscribe()
	defer stop()
	wait := func(what string, match func(Event) bool) {
		t.Helper()
		waitEvent(t, events, what, match)
	}
	// do runs f on the domain with this UUID over h's own connection (a
	// test:// file is private to its connection).
	do := func(uuid string, f func(*libvirt.Domain) error) {
		t.Helper()
		if err := h.withConn(func(c *libvirt.Connect) error {
			dom, err := c.LookupDomainByUUIDString(uuid)
			if err != nil {
				return err
			}
			defer dom.Free()
			return f(dom)
		}); err != nil {
			t.Fatal(err)
		}
	}
	define := func(name, uuid, nic string) {
		t.Helper()
		x := `<domain type='test'><name>` + name + `</name><uuid>` + uuid + `</uuid><memory>1024</memory>` +
			`<os><type>hvm</type></os><devices>` + nic + `</devices></domain>`
		if err := h.withConn(func(c *libvirt.Connect) error {
			dom, err := c.DomainDefineXML(x)
			if err == nil {
				dom.Free()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	goodNIC := `<interface type='network'><mac address='52:54:00:00:00:77'/><source network='labnet'/></interface>`

	define("node-bad", badUUID, goodNIC)
	wait("node-bad parsable", func(e Event) bool { return e.Domain.Name == "node-bad" && e.Unparsable == nil })
	if d, err := h.DomainByName("node-bad"); err != nil || len(d.Interfaces) != 1 {
		t.Fatalf("node-bad redefined parsable: %+v, %v", d, err)
	}
	if len(h.Unparsable()) != 0 || unparsableGauge(t, "skip-events") != 0 {
		t.Errorf("still unparsable: %+v", h.Unparsable())
	}
	if logs.count("Domain definition parses again") != 1 {
		t.Errorf("no log that node-bad parses again: %v", logs)
	}

	const newUUID = "88888888-8888-8888-8888-888888888888"
	define("node-new", newUUID, badInterface)
	wait("node-new unparsable", func(e Event) bool { return e.Unparsable != nil && e.Unparsable.UUID == newUUID })
	if _, err := h.DomainByName("node-new"); !errors.Is(err, ErrUnparsable) {
		t.Errorf("node-new: err = %v, want ErrUnparsable", err)
	}

	// node-a is cached; shut off and redefined, its definition is bad.
	a, err := h.DomainByName("node-a")
	if err != nil {
		t.Fatal(err)
	}
	do(a.UUID, (*libvirt.Domain).Destroy)
	define("node-a", a.UUID, badInterface)
	wait("node-a unparsable", func(e Event) bool {
		if e.Domain.UUID == a.UUID && e.Removed {
			t.Errorf("node-a reported removed: %+v", e)
		}
		return e.Unparsable != nil && e.Unparsable.UUID == a.UUID
	})
	if _, err := h.DomainByUUID(a.UUID); !errors.Is(err, ErrUnparsable) || errors.Is(err, ErrNotFound) {
		t.Errorf("node-a: err = %v, want ErrUnparsable", err)
	}
	if got := unparsableGauge(t, "skip-events"); got != 2 {
		t.Errorf("labcloud_libvirt_unparsable_domains = %v, want 2", got)
	}

	do(newUUID, (*libvirt.Domain).Undefine)
	deadline := time.Now().Add(10 * time.Second)
	for len(h.Unparsable()) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.Unparsable(); len(got) != 1 || got[0].UUID != a.UUID {
		t.Errorf("after undefining node-new: %+v, want node-a only", got)
	}
	if _, err := h.DomainByName("node-new"); !errors.Is(err, ErrNotFound) {
		t.Errorf("node-new undefined: err = %v, want ErrNotFound", err)
	}
}

func TestCut(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"truncated", 5, "trunc…"},
		{"héllo", 2, "h…"}, // not half of é
		{"héllo", 3, "hé…"},
	} {
		if got := cut(tt.s, tt.n); got != tt.want {
			t.Errorf("cut(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}
