package up

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// Registry starts `labcloud registry` as a daemon in this (the lab's)
// namespace, its images under the state directory, and waits until it
// answers on the nodes' address (lab.Addresses.RegistryAddr).
type Registry struct{}

func (*Registry) Execute(ctx context.Context, env *Env) error {
	st := env.State
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the registry: %w", err)
	}
	args := []string{"registry", "--dir", filepath.Join(st.Dir, "registry"), "--push-listen", lab.RegistryPushAddr}
	for _, gw := range env.addresses().Gateways() {
		args = append(args, "--listen", netip.AddrPortFrom(netip.MustParseAddr(gw), lab.RegistryPort).String())
	}
	p, err := controlplane.StartDaemonCommand(lab.RegistryLog(st.Dir), exec.Command(self, args...))
	if err != nil {
		return err
	}
	st.Pids[lab.RegistryPid] = p.Pid()
	url := "http://" + env.addresses().RegistryAddr() + "/v2/"
	client := &http.Client{Timeout: time.Second}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("the registry exited:\n%s", p.Tail(10))
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("the lab's registry at %s: %w (log %s)", url, err, lab.RegistryLog(st.Dir))
	}
	return nil
}
