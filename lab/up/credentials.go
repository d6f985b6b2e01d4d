package up

import (
	"context"
	"path/filepath"
	"slices"
	"strings"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// Credentials makes the tokens of the nodes, kube-proxy and CoreDNS, and
// the lab's control plane with its credentials, not running yet: the
// guests boot with them while it starts.
type Credentials struct {
	Tools *Tools

	// Made:
	ControlPlane *controlplane.ControlPlane
	Kubelets     []controlplane.Token // guest i's is Kubelets[i-1]
	ProxyToken   string               // kube-proxy's, shared by every node
	DNSToken     string               // CoreDNS's (user dnsUser)
}

func (a *Credentials) Execute(_ context.Context, env *Env) (err error) {
	for i := 1; i <= env.Opts.Nodes; i++ {
		name, _, _ := env.State.Guest(i)
		a.Kubelets = append(a.Kubelets, controlplane.Token{Token: controlplane.NewToken(), User: "system:node:" + name, Groups: []string{"system:nodes"}})
	}
	a.ProxyToken = controlplane.NewToken()
	a.DNSToken = controlplane.NewToken()
	tokens := append(slices.Clone(a.Kubelets), controlplane.Token{Token: a.ProxyToken, User: "system:kube-proxy"}, controlplane.Token{Token: a.DNSToken, User: dnsUser})
	ad := env.addresses()
	a.ControlPlane, err = newControlPlane(env.State, a.Tools, controlplane.Options{
		Address: ad.APIAddress(), AltIPs: []string{ad.Gateway(), lab.Gateway6},
		ClusterCIDR: strings.Join(ad.ClusterCIDRs(), ","), NodeCIDRMaskSizeIPv6: lab.NodeMaskSize6,
		ServiceCIDR: strings.Join(ad.ServiceCIDRs(), ","),
		Tokens:      tokens, Scheduler: true,
	})
	return err
}

// newControlPlane is the lab's control plane as opts describe it (the
// address, CIDRs, tokens; the rest is the lab's), its credentials written.
func newControlPlane(st *lab.State, tools *Tools, opts controlplane.Options) (*controlplane.ControlPlane, error) {
	opts.Tools, opts.Dir, opts.Port, opts.Daemon = tools.Dir, filepath.Join(st.Dir, "controlplane"), lab.APIPort, true
	return controlplane.New(opts)
}
