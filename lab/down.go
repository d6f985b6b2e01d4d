package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/host"
)

// Down removes everything a lab made: guests, network, daemons, the
// uplink in the host's namespace (Down runs there), the network namespace
// and the state directory. It is safe to run when no lab
// or only part of one is up, and to run twice.
func Down(dir string, out io.Writer) error {
	st := stateOrGuess(dir)
	var errs []error
	if !st.Light { // a light lab has no libvirtd: qemu:///system would be someone else's
		stopOtherHosts(st, out)
		RemoveGuests(out)
	}
	// The host lock goes last: every step below works on names the next
	// lab uses too (its namespace, whose processes stopNamespace kills, its
	// uplink, its router), and that lab's up waits for the lock. Released
	// first, CI's next lab lost its libvirtd and an ldd to this down.
	defer stopProcess(st, out, "lock-holder", "sleep") // flock --no-fork ... sleep infinity
	// The forwarder, the light lab's simulator, the registry, the control
	// plane and the CCM first, then libvirt's daemons.
	for _, p := range []struct{ key, program string }{
		{ForwarderPid, "labcloud"}, {SimulatorPid, "labcloud"}, {RegistryPid, "labcloud"}, {CCMProcess, CCMProcess}, {DNSPid, "coredns"},
		{"kube-controller-manager", "kube-controller-manager"}, {"kube-scheduler", "kube-scheduler"},
		{"kube-apiserver", "kube-apiserver"}, {"etcd", "etcd"}, {"libvirtd", "libvirtd"}, {"virtlogd", "virtlogd"},
	} {
		stopProcess(st, out, p.key, p.program)
	}
	stopRouter(dir)
	if err := removeUplink(dir, out); err != nil { // before the record in dir goes
		errs = append(errs, err)
	}
	stopNamespace(Netns, st.Pids["lock-holder"], out) // it runs there: it goes last
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if leftovers := host.GuestQEMUs(NodePrefix); len(leftovers) > 0 {
		errs = append(errs, fmt.Errorf("QEMU processes of lab guests still running: %v", leftovers))
	}
	return errors.Join(errs...)
}

// stopProcess stops the lab's process key if it still runs program.
func stopProcess(st *State, out io.Writer, key, program string) {
	if pid := st.Pids[key]; pid > 0 && host.IsProcess(pid, program) {
		fmt.Fprintf(out, "stopping %s (pid %d)\n", key, pid)
		host.Stop(pid)
	}
}

// stateOrGuess is the lab's state in dir or, for a lab that crashed before
// saving one, a state naming every host up could have made.
func stateOrGuess(dir string) *State {
	st, err := LoadState(dir)
	if err != nil {
		st = &State{Dir: dir, Pids: map[string]int{}, Hosts: labHosts(dir, MaxHosts, Addressing{})} // their names only
	}
	return st
}

// RemoveGuests destroys and undefines the lab's domains and network on
// the machine's libvirtd while it still runs; without it, their QEMU
// processes are killed.
func RemoveGuests(out io.Writer) {
	removeGuestsOn(labURI, out)
	for _, pid := range host.GuestQEMUs(NodePrefix) {
		host.Stop(pid)
	}
}

// removeGuestsOn destroys and undefines the lab's domains and network on
// the libvirtd at uri.
func removeGuestsOn(uri string, out io.Writer) {
	c, err := libvirt.NewConnect(uri)
	if err == nil {
		defer c.Close()
		if doms, err := c.ListAllDomains(0); err == nil {
			for _, d := range doms {
				if name, _ := d.GetName(); strings.HasPrefix(name, NodePrefix) {
					if active, _ := d.IsActive(); active {
						_ = d.Destroy()
					}
					_ = d.Undefine()
					fmt.Fprintf(out, "removed domain %s\n", name)
				}
				d.Free()
			}
		}
		if n, err := c.LookupNetworkByName(NetworkName); err == nil {
			_ = n.Destroy()
			_ = n.Undefine()
			n.Free()
		}
	}
}

// NodeAction stops, starts or deletes a lab guest's domain, on its host.
func NodeAction(st *State, name, action string) error {
	h, err := st.HostOfNode(name)
	if err != nil {
		return err
	}
	c, err := libvirt.NewConnect(h.URI)
	if err != nil {
		return fmt.Errorf("libvirt: %w (is the lab up?)", err)
	}
	defer c.Close()
	d, err := c.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	defer d.Free()
	switch action {
	case "stop":
		return d.Destroy()
	case "start":
		return d.Create()
	case "delete":
		if active, _ := d.IsActive(); active {
			if err := d.Destroy(); err != nil {
				return err
			}
		}
		return d.Undefine()
	}
	return fmt.Errorf("node action %q: want stop, start or delete", action)
}
