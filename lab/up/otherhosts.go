package up

import (
	"context"

	"github.com/labcloud/labcloud/lab"
)

// OtherHosts starts every host but the first, in a lab of several: in its
// namespace, its libvirtd and its network (lab.StartOtherHosts).
type OtherHosts struct{}

func (*OtherHosts) Execute(ctx context.Context, env *Env) error {
	return lab.StartOtherHosts(ctx, env.Opts, env.State)
}
