package up

import "context"

// Fixture records the light lab's nodes and writes the test driver's
// fixture of their domains, which the CCM reads as its hypervisor.
type Fixture struct{}

func (*Fixture) Execute(_ context.Context, env *Env) error {
	return env.State.WriteFixture(env.Opts.Nodes)
}
