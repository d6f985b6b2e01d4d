package provider

import (
	"context"
	"net/netip"

	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb/announce"
)

// hostRole runs the announcer from start-up in every replica, answering
// only when announce.Role says this process is the host's one answerer:
// the leader, or a stand-in (from the neighbour record) while no replica
// leads.
type hostRole struct {
	ann  *announce.Announcer
	role *announce.Role
}

func newHostRole(bridge string, ann *announce.Announcer, inPools func(netip.Addr) bool) *hostRole {
	return &hostRole{ann: ann, role: announce.NewRole(ann, bridge, inPools)}
}

// stand starts reading the bridge and standing in; it returns at once.
func (h *hostRole) stand(ctx context.Context) {
	h.role.Stand(ctx)
	go func() {
		if err := h.ann.Run(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "VIP announcer stopped")
		}
	}()
}

// lead blocks until this replica answers on the bridge.
func (h *hostRole) lead(ctx context.Context) error { return h.role.Lead(ctx) }
