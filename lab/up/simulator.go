package up

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// Simulator starts `labcloud simulate` as a daemon in this namespace: the
// light lab's nodes, registered and renewing their Leases as kubelets do.
type Simulator struct {
	ControlPlane *LightControlPlane // the simulator's credentials
	Heartbeat    time.Duration
}

func (a *Simulator) Execute(_ context.Context, env *Env) error {
	st := env.State
	kc := filepath.Join(st.Dir, "simulator.kubeconfig")
	if err := a.ControlPlane.CP.WriteKubeconfig(kc, simulatorUser, a.ControlPlane.SimulatorToken); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the simulator: %w", err)
	}
	p, err := controlplane.StartDaemon(lab.SimulatorLog(st.Dir), self, "simulate",
		"--kubeconfig", kc, "--nodes", strconv.Itoa(env.Opts.Nodes), "--heartbeat", a.Heartbeat.String())
	if err != nil {
		return err
	}
	st.Pids[lab.SimulatorPid] = p.Pid()
	time.Sleep(200 * time.Millisecond)
	if p.Exited() {
		return fmt.Errorf("the simulator exited at start:\n%s", p.Tail(20))
	}
	return nil
}

// heartbeatFor is how often the simulator renews each Lease: every 10 s as
// a kubelet does for small labs, slower for big ones so that the API server
// sees at most ~25 renewals a second.
func heartbeatFor(n int) time.Duration {
	return min(max(time.Duration(n)*time.Second/25, 10*time.Second), 5*time.Minute)
}
