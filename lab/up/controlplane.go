package up

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"

	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// Cluster is a running control plane, as the actions after it use it:
// its credentials, to write their kubeconfigs, and an admin client.
type Cluster struct {
	CP     *controlplane.ControlPlane
	Client kubernetes.Interface
}

// ControlPlane starts etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler with the credentials made before, records them in the
// state, and applies examples/rbac.yaml.
type ControlPlane struct {
	Tools       *Tools // kubectl
	Credentials *Credentials
	// Restored says etcd's data is a snapshot's, examples/rbac.yaml
	// applied in it already.
	Restored bool
	Cluster  // made
}

func (a *ControlPlane) Execute(ctx context.Context, env *Env) (err error) {
	a.CP = a.Credentials.ControlPlane
	a.Client, err = runControlPlane(ctx, env.State, a.Tools, a.CP, !a.Restored)
	return err
}

// runControlPlane starts cp's daemons, records them in the state, and
// applies examples/rbac.yaml when asked.
func runControlPlane(ctx context.Context, st *lab.State, tools *Tools, cp *controlplane.ControlPlane, rbac bool) (kubernetes.Interface, error) {
	err := cp.Run(ctx)
	for _, p := range cp.Processes() {
		st.Pids[p.Name] = p.Pid()
	}
	if err != nil {
		return nil, err
	}
	st.Kubeconfig, st.APIServer = cp.AdminKube, cp.URL
	client, err := lab.AdminClient(cp.AdminKube)
	if err != nil || !rbac {
		return client, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(tools.Dir, "kubectl"), "--kubeconfig", cp.AdminKube, "apply", "-f", "-")
	cmd.Stdin = bytes.NewReader(examples.RBAC)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apply examples/rbac.yaml: %w: %s", err, out)
	}
	return client, nil
}
