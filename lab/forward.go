package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// The API server listens inside the lab's namespace. To reach it from the
// host, `labcloud up` (on the host) opens a listening socket on the host's
// loopback and hands it to the copy of itself it runs in the namespace,
// which starts `labcloud forward` as a daemon with that socket: a socket
// keeps the namespace it was made in, so connections accepted on it come
// from the host while the dials to the API server are made in the lab's
// namespace. No setns, no second process on the host. The API server's
// certificate names 127.0.0.1, so the host kubeconfig keeps the lab's CA.

// forwarderPid is the forwarder's key in State.Pids.
const forwarderPid = "apiserver-forwarder"

// ListenHost opens the listening socket for the forwarder on the host's
// loopback (a free port) and returns it as a file to hand down.
func ListenHost() (*os.File, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on the host's loopback for the API server forwarder: %w", err)
	}
	defer l.Close()
	return l.(*net.TCPListener).File()
}

// Forward accepts connections on l and joins each to a new connection to
// target, both ways, until ctx ends; then it closes l and every connection
// and returns once its goroutines have.
func Forward(ctx context.Context, l net.Listener, target string) error {
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		l.Close()
	}()
	var d net.Dialer
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of file descriptors and the like: wait and go on.
			logger.Error(err, "Accept")
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := d.DialContext(dctx, "tcp", target)
			dcancel()
			if err != nil {
				logger.Error(err, "Dial the target", "target", target, "client", c.RemoteAddr())
				return
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stop()
			join(c, up)
		}()
	}
}

// join copies a→b and b→a; when one side ends, the other is told (half
// close) and both are done when both directions are.
func join(a, b net.Conn) {
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
}

// startForwarder starts `labcloud forward` as a daemon in this (the lab's)
// namespace with the host's listening socket, waits until the API server
// answers through it, and writes the host kubeconfig.
func (u *upRun) startForwarder(ctx context.Context) error {
	l := u.opts.HostListener
	addr, err := listenerAddr(l)
	if err != nil {
		return err
	}
	target, err := url.Parse(u.st.APIServer)
	if err != nil {
		return fmt.Errorf("API server URL %q: %w", u.st.APIServer, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the forwarder: %w", err)
	}
	cmd := exec.Command(self, "forward", "--listen-fd=3", "--to", target.Host)
	cmd.ExtraFiles = []*os.File{l}
	p, err := controlplane.StartDaemonCommand(forwarderLog(u.st.Dir), cmd)
	if err != nil {
		return err
	}
	u.st.Pids[forwarderPid] = p.Pid()
	server := "https://" + addr
	kc := filepath.Join(u.st.Dir, "kubeconfig")
	if err := writeHostKubeconfig(u.st.Kubeconfig, kc, server); err != nil {
		return err
	}
	u.st.HostKubeconfig, u.st.HostAPIServer = kc, server
	// The host's loopback cannot be dialled from here (the lab's
	// namespace): CheckHostAPIServer, run by up on the host, checks the
	// forwarder end to end.
	if p.Exited() {
		return fmt.Errorf("the API server forwarder exited:\n%s", p.Tail(10))
	}
	fmt.Fprintf(u.opts.Out, "           API server on the host at %s (kubeconfig %s)\n", server, kc)
	return nil
}

// CheckHostAPIServer waits until the lab's API server answers /readyz
// through the forwarder on the host's loopback. Run it in the host's
// namespace.
func CheckHostAPIServer(ctx context.Context, st *State) error {
	if st.HostKubeconfig == "" {
		return nil // a lab from before the forwarder
	}
	if err := waitReadyz(ctx, st.HostKubeconfig, 15*time.Second); err != nil {
		return fmt.Errorf("the API server through %s (the host's loopback): %w; see labcloud logs %s", st.HostAPIServer, err, forwarderPid)
	}
	return nil
}

// listenerAddr is the local address of a listening socket file.
func listenerAddr(f *os.File) (string, error) {
	sa, err := syscall.Getsockname(int(f.Fd()))
	if err != nil {
		return "", fmt.Errorf("host listener: %w", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		return "", fmt.Errorf("host listener: not an IPv4 socket (%T)", sa)
	}
	return net.JoinHostPort(net.IP(in4.Addr[:]).String(), fmt.Sprint(in4.Port)), nil
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
