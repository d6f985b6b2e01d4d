package up

import (
	"context"
	"fmt"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab/controlplane"
)

const (
	// lightClusterCIDR has room for MaxLightNodes /24 pod CIDRs and stays
	// clear of the service range (10.96.0.0/16).
	lightClusterCIDR = "10.128.0.0/10"
	simulatorUser    = "labcloud-simulator"
)

// LightControlPlane makes and starts the light lab's control plane, on
// the namespace's loopback, whose only client but the CCM is the
// simulator, and lets the simulator do what kubelets do.
type LightControlPlane struct {
	Tools     *Tools
	Heartbeat time.Duration // the simulator's: nodes are lost after four

	// Made:
	Cluster
	SimulatorToken string
}

func (a *LightControlPlane) Execute(ctx context.Context, env *Env) (err error) {
	a.SimulatorToken = controlplane.NewToken()
	a.CP, err = newControlPlane(env.State, a.Tools, controlplane.Options{
		Address:               "127.0.0.1",
		ClusterCIDR:           lightClusterCIDR,
		Tokens:                []controlplane.Token{{Token: a.SimulatorToken, User: simulatorUser}},
		ControllerManagerArgs: []string{"--node-monitor-grace-period", gracePeriodFor(a.Heartbeat).String()},
	})
	if err != nil {
		return err
	}
	if a.Client, err = runControlPlane(ctx, env.State, a.Tools, a.CP, true); err != nil {
		return err
	}
	return grantSimulator(ctx, a.Client)
}

// gracePeriodFor is kube-controller-manager's --node-monitor-grace-period
// for that heartbeat: its default (50 s), or four heartbeats if longer.
func gracePeriodFor(heartbeat time.Duration) time.Duration {
	return max(50*time.Second, 4*heartbeat)
}

// grantSimulator lets the simulator do what its kubelets do: create Nodes
// and create and renew their Leases; nothing else.
func grantSimulator(ctx context.Context, client kubernetes.Interface) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "labcloud:simulator"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"create", "get"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "patch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "labcloud:simulator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: simulatorUser}},
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ClusterRole %s: %w", role.Name, err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}
