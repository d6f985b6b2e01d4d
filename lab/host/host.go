// Package host reads and controls what the lab runs on the hypervisor: its
// processes, libvirt domains, and the bridge's routes, neighbours and ports.
// It knows nothing of the lab's names; callers pass the bridge, network and
// URI they mean.
package host
