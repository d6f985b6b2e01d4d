package up

import (
	"context"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// Libvirtd starts the machine's libvirtd and virtlogd for the lab.
type Libvirtd struct{}

func (*Libvirtd) Execute(ctx context.Context, env *Env) error {
	d, err := libvirtd.StartDetached(ctx, env.Opts.Dir)
	if err != nil {
		return err
	}
	env.State.Pids["libvirtd"], env.State.Pids["virtlogd"] = d.Pids()
	// Domains persist in libvirt's configuration: a lab that was
	// killed left its guests defined, and defining them again by
	// name would fail. The host lock says they are no lab's now.
	lab.RemoveGuests(env.Opts.Out)
	return nil
}
