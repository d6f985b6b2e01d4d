package provider

import (
	"context"
	"net/netip"
	"sync"

	"github.com/labcloud/labcloud/lb/announce"
)

// hostRole lets the announcer, which runs from start-up in every replica,
// answer only when announce.Role says this process is the host's one
// answerer.
//
// With hypervisors on one host, that is the leader, or a stand-in (from
// the neighbour record) while no replica leads. With hypervisors on
// several hosts, every replica answers for the VIPs of its own host's
// nodes, leader or not (placement.Follow): it takes the host's role at
// start-up, and a second process on the same host (an upgrade's) stands
// in only while the first holds no role.
type hostRole struct {
	ann     *announce.Announcer
	role    *announce.Role
	perHost bool

	once   sync.Once
	leadOK error
}

func newHostRole(bridge string, ann *announce.Announcer, inPools func(netip.Addr) bool, perHost bool) *hostRole {
	return &hostRole{ann: ann, role: announce.NewRole(ann, bridge, inPools), perHost: perHost}
}

// stand makes this replica answer what its role allows until it leads; it
// returns at once. The caller runs the announcer.
func (h *hostRole) stand(ctx context.Context) {
	if h.perHost {
		go func() { _ = h.lead(ctx) }()
		return
	}
	h.role.Stand(ctx)
}

// lead blocks until this replica answers on the bridge; calls after the
// first wait for it and return what it returned.
func (h *hostRole) lead(ctx context.Context) error {
	h.once.Do(func() { h.leadOK = h.role.Lead(ctx) })
	return h.leadOK
}
