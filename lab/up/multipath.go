package up

import (
	"context"
	"os"
)

// Multipath has the lab's host spread routed connections to VIPs over the
// CCM's multipath routes per connection, as docs/reference.md tells users
// to: the sysctl makes the kernel hash a connection's ports as well as its
// addresses. It is per network namespace, and up runs in the lab's.
type Multipath struct{}

func (*Multipath) Execute(_ context.Context, env *Env) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/fib_multipath_hash_policy", []byte("1"), 0o644); err != nil || !env.State.IPFamily.HasIPv6() {
		return err
	}
	return os.WriteFile("/proc/sys/net/ipv6/fib_multipath_hash_policy", []byte("1"), 0o644)
}
