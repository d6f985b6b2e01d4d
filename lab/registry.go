package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/lab/imageload"
	"github.com/labcloud/labcloud/lab/registry"
)

// The lab's registry (lab/registry) serves what `labcloud load` pushed to
// every node: read-only on the bridge's addresses, which each node's
// containerd uses as a mirror for every name, and read-write on the lab
// namespace's loopback only, which nothing but root on the host (entering
// the namespace) reaches. One copy for every node, present and future: a
// node started or restarted later pulls from it as the first did.
const (
	RegistryPort = 5000
	// RegistryPushAddr is where labcloud load pushes, in the lab's namespace.
	RegistryPushAddr = "127.0.0.1:5000"
	registryPid      = "registry"
	// registryHostsPath is containerd's hosts file for every registry name.
	registryHostsPath = "/etc/containerd/certs.d/_default/hosts.toml"
)

func registryLog(dir string) string { return filepath.Join(dir, "registry.log") }

// registryAddr is the registry as the nodes reach it: the bridge's address
// of the cluster's primary family, as the API server's.
func (a addressing) registryAddr() string {
	return netip.AddrPortFrom(netip.MustParseAddr(a.apiAddress), RegistryPort).String()
}

// registryHosts are the node files that send every pull to the lab's
// registry first, and each of the insecure registries' to itself over
// plain HTTP after it.
func registryHosts(a addressing, insecure []string) []image.NodeFile {
	files := []image.NodeFile{{Path: registryHostsPath, Mode: 0o644, Data: registry.HostsTOML(a.registryAddr())}}
	for _, r := range insecure {
		files = append(files, image.NodeFile{Path: path.Join(path.Dir(path.Dir(registryHostsPath)), r, "hosts.toml"), Mode: 0o644, Data: registry.PlainHTTPHostsTOML(a.registryAddr(), r)})
	}
	return files
}

// startRegistry starts `labcloud registry` as a daemon in this (the lab's)
// namespace, its images under the state directory, and waits until it
// answers on the nodes' address.
func (u *upRun) startRegistry(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the registry: %w", err)
	}
	args := []string{"registry", "--dir", filepath.Join(u.st.Dir, "registry"), "--push-listen", RegistryPushAddr}
	for _, gw := range u.st.addressing().gateways {
		args = append(args, "--listen", netip.AddrPortFrom(netip.MustParseAddr(gw), RegistryPort).String())
	}
	p, err := controlplane.StartDaemonCommand(registryLog(u.st.Dir), exec.Command(self, args...))
	if err != nil {
		return err
	}
	u.st.Pids[registryPid] = p.Pid()
	url := "http://" + u.st.addressing().registryAddr() + "/v2/"
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
		return fmt.Errorf("the lab's registry at %s: %w (log %s)", url, err, registryLog(u.st.Dir))
	}
	return nil
}

// LoadImages loads images into the lab's registry (imageload.Load), from
// this (the host's) namespace: the push address is on the lab's loopback,
// dialled from a thread that enters the lab's namespace for the dial only.
func LoadImages(ctx context.Context, st *State, opts imageload.Options) error {
	if st.Light {
		return errors.New("a light lab has no nodes to run images: labcloud load needs a full lab (labcloud up without --light)")
	}
	if st.Pids[registryPid] == 0 {
		return errors.New("this lab has no registry (it was brought up by a labcloud without load): run labcloud down, then up")
	}
	opts.Registry, opts.Transport = RegistryPushAddr, &http.Transport{DialContext: dialInNetns(st.Netns)}
	return imageload.Load(ctx, opts)
}

// dialInNetns dials in the named network namespace, on a thread that
// enters it and is never used again: its goroutine exits still locked to
// it, so the runtime ends the thread and nothing else runs in the lab's
// namespace. The socket stays there.
func dialInNetns(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			c   net.Conn
			err error
		}
		ch := make(chan dialed, 1)
		go func() {
			runtime.LockOSThread() // never unlocked, see above
			ns, err := netns.GetFromName(name)
			if err != nil {
				ch <- dialed{nil, fmt.Errorf("the lab's network namespace %s: %w", name, err)}
				return
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				ch <- dialed{nil, fmt.Errorf("enter the lab's network namespace %s: %w", name, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- dialed{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}
