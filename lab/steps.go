package lab

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// The actions of up (lab/up) that run here, beside the code of the hosts,
// the router and the CCM they start.

// upRun is what those actions work on: the options up was given, and the
// lab's state, in which they record what they start.
type upRun struct {
	opts Options
	st   *State
}

// StartOtherHosts starts every host but the first in its namespace
// (MakeNamespaces made it): its libvirtd and its network.
func StartOtherHosts(ctx context.Context, opts Options, st *State) error {
	return (&upRun{opts: opts, st: st}).startOtherHosts(ctx)
}

// StartRouter runs the LAN router and plugs every host into its LAN, or
// says why it cannot and leaves it out (then a lab of one host has no BGP;
// one of several fails).
func StartRouter(ctx context.Context, opts Options, st *State) error {
	return (&upRun{opts: opts, st: st}).startRouter(ctx)
}

// StartCCM starts the lab's CCM with bin, its credentials from cp: the
// light lab's on the test driver; the full lab's on every host, then it
// waits for their BGP sessions.
func StartCCM(ctx context.Context, opts Options, st *State, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string) error {
	u := &upRun{opts: opts, st: st}
	if st.Light {
		return u.startLightCCM(ctx, cp, client, bin)
	}
	return u.startCCM(ctx, cp, client, bin)
}
