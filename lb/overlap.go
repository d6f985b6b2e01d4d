package lb

import "net/netip"

// Overlap returns the first of the pool's address specs (as the user wrote
// it) that shares an address with the inclusive range first-last.
func (p *Pool) Overlap(first, last netip.Addr) (spec string, ok bool) {
	for _, r := range p.ranges {
		if r.first.BitLen() == first.BitLen() && r.first.Compare(last) <= 0 && first.Compare(r.last) <= 0 {
			return r.spec, true
		}
	}
	return "", false
}
