package lb

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Family is an IP family. The values match Kubernetes' IPFamily strings.
type Family string

// The two IP families.
const (
	IPv4 Family = "IPv4"
	IPv6 Family = "IPv6"
)

// FamilyOf returns the family of a valid address.
func FamilyOf(ip netip.Addr) Family {
	if ip.Is4() {
		return IPv4
	}
	return IPv6
}

// index is f's slot in per-family arrays: 0 for IPv4, 1 for IPv6.
func (f Family) index() int {
	if f == IPv6 {
		return 1
	}
	return 0
}

// defaultFamilies follows the requested addresses; IPv4 when there are
// none.
func defaultFamilies(ips []netip.Addr) []Family {
	if len(ips) == 0 {
		return []Family{IPv4}
	}
	fams := make([]Family, len(ips))
	for i, ip := range ips {
		fams[i] = FamilyOf(ip)
	}
	return fams
}

// parseFamilies reads spec.ipFamilies: known families, each once.
func parseFamilies(in []v1.IPFamily) ([]Family, error) {
	var fams []Family
	for _, f := range in {
		switch fam := Family(f); fam {
		case IPv4, IPv6:
			if slices.Contains(fams, fam) {
				return nil, fmt.Errorf("%s listed twice", fam)
			}
			fams = append(fams, fam)
		default:
			return nil, fmt.Errorf("unknown family %q", f)
		}
	}
	return fams, nil
}
