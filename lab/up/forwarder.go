package up

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/relay"
)

// The API server listens inside the lab's namespace. To reach it from the
// host, `labcloud up` (on the host) opens a listening socket on the host's
// loopback and hands it to the copy of itself it runs in the namespace,
// which starts `labcloud forward` as a daemon with that socket: a socket
// keeps the namespace it was made in, so connections accepted on it come
// from the host while the dials to the API server are made in the lab's
// namespace. No setns, no second process on the host. The API server's
// certificate names 127.0.0.1, so the host kubeconfig keeps the lab's CA.

// Forwarder starts `labcloud forward` as a daemon in this (the lab's)
// namespace with the host's listening socket (Options.HostListener), and
// writes the host kubeconfig.
type Forwarder struct {
	Cluster *Cluster // the API server and its admin kubeconfig
}

func (a *Forwarder) Execute(_ context.Context, env *Env) error {
	st, cp := env.State, a.Cluster.CP
	addr, err := relay.Addr(env.Opts.HostListener)
	if err != nil {
		return err
	}
	target, err := url.Parse(cp.URL)
	if err != nil {
		return fmt.Errorf("API server URL %q: %w", cp.URL, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the forwarder: %w", err)
	}
	cmd := exec.Command(self, "forward", "--listen-fd=3", "--to", target.Host)
	cmd.ExtraFiles = []*os.File{env.Opts.HostListener}
	p, err := controlplane.StartDaemonCommand(lab.ForwarderLog(st.Dir), cmd)
	if err != nil {
		return err
	}
	st.Pids[lab.ForwarderPid] = p.Pid()
	server := "https://" + addr
	kc := filepath.Join(st.Dir, "kubeconfig")
	if err := writeHostKubeconfig(cp.AdminKube, kc, server); err != nil {
		return err
	}
	st.HostKubeconfig, st.HostAPIServer = kc, server
	// The host's loopback cannot be dialled from here (the lab's
	// namespace): CheckHostAPIServer, run by up on the host, checks the
	// forwarder end to end.
	if p.Exited() {
		return fmt.Errorf("the API server forwarder exited:\n%s", p.Tail(10))
	}
	env.say("API server on the host at %s (kubeconfig %s)", server, kc)
	return nil
}

// CheckHostAPIServer waits until the lab's API server answers /readyz
// through the forwarder on the host's loopback. Run it in the host's
// namespace.
func CheckHostAPIServer(ctx context.Context, st *lab.State) error {
	if st.HostKubeconfig == "" {
		return nil // a lab from before the forwarder
	}
	if err := waitReadyz(ctx, st.HostKubeconfig, 15*time.Second); err != nil {
		return fmt.Errorf("the API server through %s (the host's loopback): %w; see labcloud logs %s", st.HostAPIServer, err, lab.ForwarderPid)
	}
	return nil
}

// writeHostKubeconfig copies the admin kubeconfig with server replaced.
func writeHostKubeconfig(admin, path, server string) error {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// waitReadyz polls the API server's /readyz with kubeconfig kc.
func waitReadyz(ctx context.Context, kc string, timeout time.Duration) error {
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		return err
	}
	var server string
	pool := x509.NewCertPool()
	for _, c := range cfg.Clusters {
		server = c.Server
		pool.AppendCertsFromPEM(c.CertificateAuthorityData)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		resp.Body.Close()
		last = fmt.Errorf("/readyz: %s", resp.Status)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}
