package lb

import (
	"fmt"
	"net/netip"

	"go4.org/netipx"
)

// unusable are the blocks no VIP may come from: a VIP there is either
// never delivered to the bridge or refused by the announcer, and the
// Service holding it would wait forever.
var unusable = []struct {
	block netip.Prefix
	what  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network (0.0.0.0/8)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// checkUsable fails when r holds an address of an unusable block, naming
// the block.
func checkUsable(r netipx.IPRange) error {
	for _, u := range unusable {
		if r.Overlaps(netipx.RangeOfPrefix(u.block)) {
			return fmt.Errorf("overlaps %s addresses %s; no VIP can come from there", u.what, u.block)
		}
	}
	return nil
}
