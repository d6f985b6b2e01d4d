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
type hostRole struct {
	ann  *announce.Announcer
	role *announce.Role
}

func newHostRole(bridge string, ann *announce.Announcer, inPools func(netip.Addr) bool) *hostRole {
	return &hostRole{ann: ann, role: announce.NewRole(ann, bridge, inPools)}
}

// stand stands in for a missing leader until this replica leads; it
// returns at once. The caller runs the announcer.
func (h *hostRole) stand(ctx context.Context) { h.role.Stand(ctx) }

// lead blocks until this replica answers on the bridge.
func (h *hostRole) lead(ctx context.Context) error { return h.role.Lead(ctx) }
