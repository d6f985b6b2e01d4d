package provider

import (
	"context"
	"net/netip"

	"github.com/labcloud/labcloud/lb/announce"
)

// hostRole lets the announcer, which runs from start-up in every replica,
// answer only when announce.Role says this process is the host's one answerer:
// the leader, or a stand-in (from the neighbour record) while no replica
// leads.
//
// With hypervisors on several hosts there is no stand-in: announce.Role
// sees the replicas of its own host only, so a replica that does not lead
// would stand in beside a leader on another host, and two would answer on
// the LAN. Only the leader answers there.
type hostRole struct {
	ann     *announce.Announcer
	role    *announce.Role
	standIn bool
}

func newHostRole(bridge string, ann *announce.Announcer, inPools func(netip.Addr) bool, standIn bool) *hostRole {
	return &hostRole{ann: ann, role: announce.NewRole(ann, bridge, inPools), standIn: standIn}
}

// stand stands in for a missing leader until this replica leads, where
// replicas may; it returns at once. The caller runs the announcer.
func (h *hostRole) stand(ctx context.Context) {
	if !h.standIn {
		h.ann.SetActive(false)
		return
	}
	h.role.Stand(ctx)
}

// lead blocks until this replica answers on the bridge.
func (h *hostRole) lead(ctx context.Context) error { return h.role.Lead(ctx) }
