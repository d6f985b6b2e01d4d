package up

import (
	"context"

	"github.com/labcloud/labcloud/lab/libvirtd"
)

// ClaimHost waits until no e2e run or other lab uses the host (its one
// libvirtd, the lab's namespace name), then holds the host lock through a
// process that outlives up; down stops it.
type ClaimHost struct{}

func (*ClaimHost) Execute(_ context.Context, env *Env) error {
	release, err := libvirtd.Lock(context.Background(), func() {
		env.say("waiting for an e2e run or another lab to release the host")
	})
	if err != nil {
		return err
	}
	release()
	holder, err := libvirtd.HoldLock(env.Opts.Dir)
	if err != nil {
		return err
	}
	env.State.Pids["lock-holder"] = holder.Pid()
	return nil
}
