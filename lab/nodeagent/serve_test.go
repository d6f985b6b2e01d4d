package nodeagent

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func get(t *testing.T, addr string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/any/path")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestNameServer(t *testing.T) {
	ifs := newFakeInterfaces()
	fl := &fakeListen{ifs: ifs, at: map[netip.AddrPort]string{}}
	s := NewNameServer("node-7", fl.listen)
	ctx := context.Background()

	vip := netip.MustParseAddr("192.168.100.10")
	a, b := netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(vip, 443)
	// Without the VIP on lo the bind fails, and is reported.
	if err := s.Start(ctx, []netip.AddrPort{a}); err == nil {
		t.Fatal("Start without the VIP succeeded")
	}
	if got := s.Listening(); len(got) != 0 {
		t.Fatalf("Listening = %v after a failed start", got)
	}
	if err := ifs.AddAddr("lo", netip.PrefixFrom(vip, 32)); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, []netip.AddrPort{b, a}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, []netip.AddrPort{a}); err != nil { // idempotent
		t.Fatal(err)
	}
	if got, want := s.Listening(), []netip.AddrPort{a, b}; !slices.Equal(got, want) {
		t.Errorf("Listening = %v, want %v", got, want)
	}
	for _, ap := range []netip.AddrPort{a, b} {
		body, err := get(t, fl.addr(ap))
		if err != nil || body != "node-7\n" {
			t.Errorf("GET %s = %q, %v; want %q", ap, body, err, "node-7\n")
		}
	}
	s.Stop(ctx, []netip.AddrPort{a})
	if _, err := get(t, fl.addr(a)); err == nil {
		t.Errorf("GET %s after Stop succeeded", a)
	}
	if body, err := get(t, fl.addr(b)); err != nil || body != "node-7\n" {
		t.Errorf("GET %s = %q, %v after stopping another", b, body, err)
	}
	s.Close()
	if _, err := get(t, fl.addr(b)); err == nil {
		t.Errorf("GET %s after Close succeeded", b)
	}
	if got := s.Listening(); len(got) != 0 {
		t.Errorf("Listening after Close = %v", got)
	}
}
