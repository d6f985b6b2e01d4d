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

// other is the family that is not f.
func (f Family) other() Family {
	if f == IPv6 {
		return IPv4
	}
	return IPv6
}

// FamilyPolicy is spec.ipFamilyPolicy; the values match Kubernetes'. The
// zero value, as for a Service that sets none, is SingleStack.
type FamilyPolicy string

// The three policies.
const (
	// SingleStack gets a VIP for each family listed, all or none.
	SingleStack FamilyPolicy = "SingleStack"
	// PreferDualStack gets what the pools can give: a family none of
	// whose pools has a free address is skipped if another gets one.
	PreferDualStack FamilyPolicy = "PreferDualStack"
	// RequireDualStack gets a VIP of both families, or none.
	RequireDualStack FamilyPolicy = "RequireDualStack"
)

// parsePolicy reads spec.ipFamilyPolicy; nil is the zero policy.
func parsePolicy(p *v1.IPFamilyPolicy) (FamilyPolicy, error) {
	if p == nil {
		return "", nil
	}
	if pol := FamilyPolicy(*p); pol.valid() {
		return pol, nil
	}
	return "", fmt.Errorf("unknown policy; want %s, %s or %s", SingleStack, PreferDualStack, RequireDualStack)
}

func (p FamilyPolicy) valid() bool {
	return p == "" || p == SingleStack || p == PreferDualStack || p == RequireDualStack
}

// dual reports whether p asks for both families.
func (p FamilyPolicy) dual() bool { return p == PreferDualStack || p == RequireDualStack }

// missingFamily is the error of a RequireDualStack request that lists one
// family only.
func missingFamily(p FamilyPolicy, fams []Family) error {
	if p != RequireDualStack || len(fams) != 1 {
		return nil
	}
	return fmt.Errorf("%s needs both families; %s is missing", p, fams[0].other())
}

// defaultFamilies follows the requested addresses, IPv4 first when there
// are none; a dual-stack policy adds the other family, as the API server
// defaults spec.ipFamilies.
func defaultFamilies(ips []netip.Addr, p FamilyPolicy) []Family {
	fams := []Family{IPv4}
	if len(ips) > 0 {
		fams = make([]Family, len(ips))
		for i, ip := range ips {
			fams[i] = FamilyOf(ip)
		}
	}
	if p.dual() && len(fams) == 1 {
		fams = append(fams, fams[0].other())
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
