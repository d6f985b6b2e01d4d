package up

import (
	"context"

	"github.com/labcloud/labcloud/lab"
)

// CCM starts the lab's CCM as examples/ ships it (lab.StartCCM): on the
// test driver in a light lab; on every host, peering with the router when
// it runs, in a full one.
type CCM struct {
	Binaries *Binaries // the CCM
	Cluster  *Cluster  // its credentials and the API server
}

func (a *CCM) Execute(ctx context.Context, env *Env) error {
	return lab.StartCCM(ctx, env.Opts, env.State, a.Cluster.CP, a.Cluster.Client, a.Binaries.CCM)
}
