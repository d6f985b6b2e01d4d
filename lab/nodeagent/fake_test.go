package nodeagent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
)

// fakeInterfaces keeps addresses in maps, like the kernel would.
type fakeInterfaces struct {
	mu    sync.Mutex
	addrs map[string][]netip.Prefix
}

var _ Interfaces = (*fakeInterfaces)(nil)

func newFakeInterfaces() *fakeInterfaces {
	return &fakeInterfaces{addrs: map[string][]netip.Prefix{
		"lo": {netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")},
	}}
}

func (f *fakeInterfaces) EnsureDummy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.addrs[name]; !ok {
		f.addrs[name] = []netip.Prefix{netip.MustParsePrefix("fe80::1/64")}
	}
	return nil
}

func (f *fakeInterfaces) Addrs(ifname string) ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.addrs[ifname]
	if !ok {
		return nil, fmt.Errorf("look up %s: %w", ifname, syscall.ENODEV)
	}
	return slices.Clone(a), nil
}

func (f *fakeInterfaces) AddAddr(ifname string, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.addrs[ifname]
	if !ok {
		return fmt.Errorf("look up %s: %w", ifname, syscall.ENODEV)
	}
	if !slices.Contains(a, p) {
		f.addrs[ifname] = append(a, p)
	}
	return nil
}

func (f *fakeInterfaces) DelAddr(ifname string, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs[ifname] = slices.DeleteFunc(f.addrs[ifname], func(q netip.Prefix) bool { return q == p })
	return nil
}

// get returns the addresses of an interface, sorted.
func (f *fakeInterfaces) get(ifname string) []netip.Prefix {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := slices.Clone(f.addrs[ifname])
	slices.SortFunc(a, comparePrefix)
	return a
}

func (f *fakeInterfaces) has(ifname string, a netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.addrs[ifname], func(p netip.Prefix) bool { return p.Addr() == a })
}

// fakeListen stands in for binding VIP:port: it fails like the kernel when
// the VIP is not on lo, and otherwise listens on a free loopback port,
// remembering where each VIP:port really is.
type fakeListen struct {
	ifs *fakeInterfaces
	mu  sync.Mutex
	at  map[netip.AddrPort]string
}

func (l *fakeListen) listen(ctx context.Context, network, address string) (net.Listener, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, err
	}
	if !l.ifs.has("lo", ap.Addr()) {
		return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRNOTAVAIL}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at[ap] = ln.Addr().String()
	return ln, nil
}

func (l *fakeListen) addr(ap netip.AddrPort) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[ap]
}
