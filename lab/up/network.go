package up

import (
	"context"
	"os"
)

// Network creates the first host's libvirt network, the lab's bridge.
type Network struct{}

func (*Network) Execute(_ context.Context, env *Env) error {
	if err := noIPv6DAD(); err != nil {
		return err
	}
	return env.State.CreateNetwork(env.State.Hosts[0])
}

// noIPv6DAD turns duplicate address detection off for the links made
// from now on in the lab's namespace (up runs there): the bridge has no
// carrier until a guest is plugged in, and until then an address under
// detection stays tentative, so CoreDNS and the API server could not bind
// the bridge's IPv6 address. The lab owns the link and pins every guest
// elsewhere: there is nothing to detect.
func noIPv6DAD() error {
	return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
}
