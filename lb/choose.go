package lb

import (
	"maps"
	"net/netip"
	"slices"
)

// Ranked is the k nodes of eligible that rank highest for vip, best first,
// by the hash of (vip, node): rendezvous hashing. The first is the node
// that answers for vip (its announcer); the spread route goes via all k.
// It depends on nothing but its arguments, so a restarted CCM, a new leader
// and every replica compute the same ranking; a node that stops being
// eligible moves only the VIPs it answered for (each to its own runner-up),
// a node that joins takes only the VIPs it now wins, and VIPs spread
// evenly; likewise a node joining or leaving changes only the lists it
// enters or leaves. Equal hashes (never seen in practice) rank the smaller
// name first. Duplicates and order in eligible do not matter.
func Ranked(vip netip.Addr, eligible []string, k int) []string {
	type ranked struct {
		node  string
		score uint64
	}
	// before says whether a ranks before b.
	before := func(a, b ranked) bool { return a.score > b.score || a.score == b.score && a.node < b.node }
	best := make([]ranked, 0, k)
	vh := vipHash(vip)
	for _, n := range eligible {
		r := ranked{n, score(vh, n)}
		if len(best) == k && !before(r, best[k-1]) {
			continue
		}
		i := len(best)
		for i > 0 && before(r, best[i-1]) {
			i--
		}
		if i > 0 && best[i-1] == r {
			continue // a duplicate
		}
		if len(best) == k {
			best = best[:k-1]
		}
		best = slices.Insert(best, i, r)
	}
	out := make([]string, len(best))
	for i, r := range best {
		out[i] = r.node
	}
	return out
}

// Place ranks every VIP's own eligible nodes at once (externalTrafficPolicy
// Local narrows them per VIP), keeping the k best: the first is the node
// that answers it. VIPs with no eligible node are left
// out.
func Place(eligible map[netip.Addr][]string, k int) map[netip.Addr][]string {
	return PlaceTogether(eligible, nil, k)
}

// PlaceTogether is Place where some VIPs must be answered by one node:
// each VIP ranks as keys[vip] does (itself when absent, see RankKeys), and
// the VIPs of one key rank only the nodes all of them may use, so they
// share their first node and move together. VIPs of one key with no node
// in common each rank their own.
func PlaceTogether(eligible map[netip.Addr][]string, keys map[netip.Addr]netip.Addr, k int) map[netip.Addr][]string {
	groups := make(map[netip.Addr][]netip.Addr, len(keys)) // a key → the other VIPs ranked as it
	for vip, key := range keys {
		if _, ok := eligible[vip]; ok && vip != key {
			groups[key] = append(groups[key], vip)
		}
	}
	common := make(map[netip.Addr][]string, len(groups))
	for key, others := range groups {
		common[key] = inCommon(eligible, key, others)
	}
	out := make(map[netip.Addr][]string, len(eligible))
	for vip, nodes := range eligible {
		key, ok := keys[vip]
		if !ok {
			key = vip
		}
		if c := common[key]; len(c) > 0 {
			nodes = c
		}
		if r := Ranked(key, nodes, k); len(r) > 0 {
			out[vip] = r
		}
	}
	return out
}

// inCommon are the nodes eligible for every VIP of others, and for key
// when key itself is placed; in no particular order (Ranked needs none).
func inCommon(eligible map[netip.Addr][]string, key netip.Addr, others []netip.Addr) []string {
	members := others
	if _, ok := eligible[key]; ok {
		members = append([]netip.Addr{key}, others...)
	}
	in := map[string]bool{}
	for _, n := range eligible[members[0]] {
		in[n] = true
	}
	for _, vip := range members[1:] {
		both := make(map[string]bool, len(in))
		for _, n := range eligible[vip] {
			if in[n] {
				both[n] = true
			}
		}
		in = both
	}
	return slices.Collect(maps.Keys(in))
}

// RankKeys says which VIPs must rank as another so that one node answers
// both: an IPv6 VIP held by a Service that also holds an IPv4 VIP (dual
// stack) ranks as the lowest such IPv4 VIP of its holders. VIPs not in the
// result rank as themselves. It depends only on which Services hold which
// VIPs, as recorded in their statuses, so every replica and every restart
// agrees.
func RankKeys(vips []VIP) map[netip.Addr]netip.Addr {
	v4 := map[string]netip.Addr{} // Service → its IPv4 VIP (at most one)
	for _, v := range vips {
		if FamilyOf(v.IP) == IPv4 {
			for _, h := range v.Holders {
				v4[h] = v.IP
			}
		}
	}
	keys := map[netip.Addr]netip.Addr{}
	for _, v := range vips {
		if FamilyOf(v.IP) != IPv6 {
			continue
		}
		key := v.IP
		for _, h := range v.Holders {
			// IPv4 sorts before IPv6: the first found replaces v.IP.
			if ip, ok := v4[h]; ok && ip.Less(key) {
				key = ip
			}
		}
		if key != v.IP {
			keys[v.IP] = key
		}
	}
	return keys
}

// FNV-1a, 64 bit, then a final mix: stable across processes, releases and
// architectures (unlike hash/maphash), so every replica agrees.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// vipHash is the hash state after the VIP's 16-byte form and a separator,
// computed once per VIP and extended by each node name.
func vipHash(vip netip.Addr) uint64 {
	b := vip.Unmap().As16()
	h := uint64(fnvOffset)
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return h * fnvPrime // the zero separator: h ^ 0 == h
}

// score is the rendezvous weight of node for the VIP whose state is vh.
// FNV alone lets names that differ in their last byte land close together;
// the splitmix64 finalizer spreads them over the whole range.
func score(vh uint64, node string) uint64 {
	h := vh
	for i := 0; i < len(node); i++ {
		h = (h ^ uint64(node[i])) * fnvPrime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
