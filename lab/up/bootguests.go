package up

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/guest"
	"github.com/labcloud/labcloud/lab/image"
)

// BootGuests boots the guests, spread round robin over the lab's hosts,
// each with its node's files (nodeFiles) in its initrd, and records them
// in the state.
type BootGuests struct {
	Credentials *Credentials // the CA, the kubelets' and kube-proxy's tokens
	Image       *BootImage   // kernel and initramfs
	Disk        *RootDisk
}

func (a *BootGuests) Execute(_ context.Context, env *Env) error {
	st, opts := env.State, env.Opts
	conns := make([]*libvirt.Connect, len(st.Hosts))
	for k, h := range st.Hosts {
		c, err := libvirt.NewConnect(h.URI)
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		defer c.Close()
		conns[k] = c
	}
	connOf := func(i int) *libvirt.Connect { _, _, on := st.Guest(i); return conns[on.Index-1] }
	nodes := filepath.Join(st.Dir, "nodes")
	if err := os.MkdirAll(nodes, 0o700); err != nil {
		return err
	}
	typ, why := guest.ChooseAccel(guest.GatherEvidence())
	if typ == guest.KVM {
		env.say("guests use KVM")
	} else {
		env.say("guests use TCG: %s", why)
	}
	art, creds := a.Image.Artifacts, a.Credentials
	guests := make(map[string]guest.Guest, opts.Nodes)
	index := make(map[string]int, opts.Nodes)
	for i := 1; i <= opts.Nodes; i++ {
		name, mac, _ := st.Guest(i)
		initrd := filepath.Join(nodes, name+".initrd")
		files, err := nodeFiles(nodeIdentity{
			Name:         name,
			APIServer:    env.addresses().APIServerURL(),
			CAPEM:        creds.ControlPlane.CAData,
			KubeletToken: creds.Kubelets[i-1].Token,
			ProxyToken:   creds.ProxyToken,
			Addressing:   env.addresses(),
			Insecure:     st.InsecureRegistries,
		})
		if err != nil {
			return err
		}
		if err := image.WriteNodeInitrd(initrd, art.Initramfs, files); err != nil {
			return err
		}
		g := guest.Guest{Name: name, Initrd: initrd, Kernel: art.Kernel, Disk: a.Disk.Disk.Path, Console: lab.ConsoleLog(st.Dir, name),
			MAC: mac, Network: lab.NetworkName, HostCoresEach: runtime.NumCPU() / opts.Nodes}
		if err := g.Boot(connOf(i), typ); err != nil {
			return err
		}
		guests[name], index[name] = g, i
		st.Nodes = append(st.Nodes, name)
	}
	if typ == guest.KVM {
		if err := bootSilentWithTCG(env, func(name string) *libvirt.Connect { return connOf(index[name]) }, guests); err != nil {
			return err
		}
	}
	if len(conns) > 1 {
		env.say("%d guests booting on %d hosts, round robin; consoles in %s", opts.Nodes, len(conns), nodes)
	} else {
		env.say("%d guests booting; consoles in %s", opts.Nodes, nodes)
	}
	return st.Save()
}

// kvmConsoleBound is how long a KVM guest may stay silent on its console
// before it is taken for one a broken KVM hangs, and booted with TCG.
const kvmConsoleBound = 20 * time.Second

// bootSilentWithTCG boots with TCG each KVM guest that has written nothing
// to its console within kvmConsoleBound: an unknown broken KVM costs
// seconds, not a hung up.
func bootSilentWithTCG(env *Env, connOf func(name string) *libvirt.Connect, guests map[string]guest.Guest) error {
	silent := silentConsoles(guests, time.Now().Add(kvmConsoleBound), 250*time.Millisecond)
	for _, name := range silent {
		env.say("%s: no console output %s after booting with KVM; booting it with TCG", name, kvmConsoleBound)
		c := connOf(name)
		d, err := c.LookupDomainByName(name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		err = d.Destroy()
		d.Free()
		if err != nil {
			return fmt.Errorf("destroy %s: %w", name, err)
		}
		if err := guests[name].Boot(c, guest.TCG); err != nil {
			return err
		}
	}
	return nil
}

// silentConsoles waits until every guest has written to its console or
// the deadline passes, and names those that have not, sorted.
func silentConsoles(guests map[string]guest.Guest, deadline time.Time, poll time.Duration) []string {
	for {
		var silent []string
		for name, g := range guests {
			if fi, err := os.Stat(g.Console); err != nil || fi.Size() == 0 {
				silent = append(silent, name)
			}
		}
		if len(silent) == 0 || !time.Now().Before(deadline) {
			slices.Sort(silent)
			return silent
		}
		time.Sleep(poll)
	}
}
