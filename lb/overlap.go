package lb

import (
	"net/netip"

	"go4.org/netipx"
)

// Overlap returns the first of the pool's address specs (as the user wrote
// it) that shares an address with the inclusive range first-last. A range
// that is not one (mixed families, or last before first) overlaps nothing.
func (p *Pool) Overlap(first, last netip.Addr) (spec string, ok bool) {
	q := netipx.IPRangeFrom(first, last)
	for _, r := range p.ranges {
		if r.Overlaps(q) {
			return r.spec, true
		}
	}
	return "", false
}
