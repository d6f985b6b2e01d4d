package lb

import (
	"slices"
	"strings"
)

// ChooseAnnouncer picks the node that answers ARP for vip. eligible is
// already filtered by the caller (running domain, Ready, ready endpoints
// for externalTrafficPolicy Local); load counts the VIPs each node answers
// for now. current is kept while it is eligible, because every move costs
// clients a round of gratuitous ARP and broken connections. Otherwise the
// least-loaded eligible node wins; ties go to the node with the lowest
// hash of (vip, node), so that VIPs chosen from the same loads still land
// on different nodes, and the result never depends on the order of
// eligible. It returns "" when no node is eligible.
func ChooseAnnouncer(vip, current string, eligible []string, load map[string]int) string {
	if current != "" && slices.Contains(eligible, current) {
		return current
	}
	best, bestLoad, bestHash := "", 0, uint64(0)
	vh := vipHash(vip)
	for _, n := range eligible {
		l, h := load[n], fnvAdd(vh, n)
		better := best == "" || l < bestLoad ||
			l == bestLoad && (h < bestHash || h == bestHash && n < best)
		if better {
			best, bestLoad, bestHash = n, l, h
		}
	}
	return best
}

// AnnouncerInput is what ChooseAnnouncers needs to know about one VIP.
type AnnouncerInput struct {
	Current  string   // node answering now, "" if none
	Eligible []string // nodes allowed to answer
}

// ChooseAnnouncers picks a node for every VIP at once. VIPs whose current
// node is still eligible keep it and count towards its load first; the
// others are then placed in VIP order, each adding to the load of the node
// it got, so a node that fails spreads its VIPs over the rest. VIPs with no
// eligible node are left out of the result.
func ChooseAnnouncers(vips map[string]AnnouncerInput) map[string]string {
	out := make(map[string]string, len(vips))
	load := map[string]int{}
	var moving []string
	for vip, in := range vips {
		if in.Current != "" && slices.Contains(in.Eligible, in.Current) {
			out[vip] = in.Current
			load[in.Current]++
		} else {
			moving = append(moving, vip)
		}
	}
	slices.SortFunc(moving, strings.Compare)
	for _, vip := range moving {
		if n := ChooseAnnouncer(vip, "", vips[vip].Eligible, load); n != "" {
			out[vip] = n
			load[n]++
		}
	}
	return out
}

// FNV-1a, 64 bit: stable across processes and releases, unlike
// hash/maphash, so a restarted CCM breaks ties the same way.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// tieHash hashes vip, a zero byte and node.
func tieHash(vip, node string) uint64 { return fnvAdd(vipHash(vip), node) }

// vipHash is the hash state after vip and the zero separator, computed
// once per VIP and extended by each node name.
func vipHash(vip string) uint64 {
	return fnvAdd(fnvOffset, vip) * fnvPrime // the separator: h ^ 0 == h
}

func fnvAdd(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}
