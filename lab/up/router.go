package up

import (
	"context"

	"github.com/labcloud/labcloud/lab"
)

// Router runs the LAN router, FRR, and plugs every host into its LAN
// (lab.StartRouter); it records in the state whether it runs, which the
// CCM's cloud config follows.
type Router struct{}

func (*Router) Execute(ctx context.Context, env *Env) error {
	return lab.StartRouter(ctx, env.Opts, env.State)
}
