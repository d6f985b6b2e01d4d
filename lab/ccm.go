package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// cloudConfig is the CCM's --cloud-config in the lab.
func cloudConfig() string {
	return fmt.Sprintf(`region: lab
hypervisors:
  - uri: qemu:///system
    zone: lab-host
networks: [%s]
routes:
  bridge: %s
loadBalancer:
  bridge: %s
  pools: [{name: lab, addresses: ["%s"]}]
`, NetworkName, Bridge, Bridge, VIPPool)
}

func (u *upRun) startCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string) error {
	return u.runCCM(ctx, cp, client, bin, cloudConfig())
}

// runCCM starts the CCM as a daemon as examples/ ships it: the flags of the
// systemd unit (leader election, secure serving with delegated
// authentication and authorization) with the lab's own files in place of
// the unit's, and the identity of examples/rbac.yaml (a service-account
// token).
func (u *upRun) runCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin, cloudCfg string) error {
	tr, err := client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "cloud-controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](7 * 24 * 3600)}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for the CCM service account: %w", err)
	}
	kc := filepath.Join(u.st.Dir, "ccm.kubeconfig")
	if err := cp.WriteKubeconfig(kc, "cloud-controller-manager", tr.Status.Token); err != nil {
		return err
	}
	cfg := filepath.Join(u.st.Dir, "cloud-config.yaml")
	if err := os.WriteFile(cfg, []byte(cloudCfg), 0o600); err != nil {
		return err
	}
	args, err := examples.CCMArgs(map[string]string{examples.UnitKubeconfig: kc, examples.UnitCloudConfig: cfg})
	if err != nil {
		return fmt.Errorf("the CCM's command line from examples/: %w", err)
	}
	u.st.CCMCommand = append([]string{bin}, args...)
	return u.st.launchCCM()
}

// launchCCM starts the CCM as a daemon with the command recorded in the
// state (runCCM records it; chaos restarts the CCM with it) and records its pid.
func (s *State) launchCCM() error {
	if len(s.CCMCommand) == 0 {
		return fmt.Errorf("no CCM command in the lab state %s", statePath(s.Dir))
	}
	p, err := controlplane.StartDaemon(filepath.Join(s.Dir, "ccm.log"), s.CCMCommand[0], s.CCMCommand[1:]...)
	if err != nil {
		return err
	}
	s.Pids[ccmPid] = p.Pid()
	time.Sleep(500 * time.Millisecond)
	if p.Exited() {
		return fmt.Errorf("the CCM exited at start:\n%s", p.Tail(20))
	}
	return nil
}
