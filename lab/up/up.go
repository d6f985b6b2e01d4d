// Package up brings a lab up (labcloud up), full or light: it checks the
// options, records the lab about to be made, then runs the lab's actions
// in order, each a named step, timed and recorded in the lab's State.
// An action is a struct, one per file: its fields are what it reads (the
// actions before it that made that) and what it makes. The root package
// lab keeps State, Options, Down and Status.
package up

import (
	"context"
	"fmt"
	"time"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/snapshot"
)

// Full brings a lab of real guests up. It must run as root inside the
// lab's network namespace (cmd/labcloud arranges that). The daemons it
// starts outlive it.
func Full(ctx context.Context, opts lab.Options) (*lab.State, error) {
	opts.Light = false
	r, err := begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	st, opts := r.env.State, r.env.Opts
	tools := do(r, "control-plane tools", &Tools{})
	bins := do(r, "build CCM and lab-node", &Binaries{})
	img := do(r, "guest boot image", &BootImage{})
	disk := do(r, "node root disk", &RootDisk{Tools: tools, Binaries: bins, Image: img})
	var key snapshot.Key
	if r.err == nil && snapshotsFit(st) && !(opts.Fresh && opts.NoSnapshot) {
		if key, r.err = snapshotKey(r.env, tools, img, disk); r.err != nil {
			return st, r.err
		}
		if m, ok := lab.Snapshots().Find(key); ok && !opts.Fresh {
			if err := restore(r, m, tools, bins); err != nil {
				return st, restoreFailed(r.env, m, err)
			}
			return st, st.Save()
		}
	}
	do(r, "claim the host's libvirtd", &ClaimHost{})
	do(r, "libvirtd", &Libvirtd{})
	do(r, fmt.Sprintf("libvirt network %s (%s)", lab.NetworkName, st.IPFamily), &Network{})
	do(r, "multipath hash per connection", &Multipath{})
	do(r, "image registry (labcloud load)", &Registry{})
	if len(st.Hosts) > 1 {
		do(r, fmt.Sprintf("hosts 2-%d: namespace, libvirtd, network", len(st.Hosts)), &OtherHosts{})
	}
	// The guests boot while the control plane starts: a TCG guest needs
	// longer to boot than the API server to start, and its kubelet retries.
	creds := do(r, "control plane credentials", &Credentials{Tools: tools})
	do(r, fmt.Sprintf("boot %d guests", opts.Nodes), &BootGuests{Credentials: creds, Image: img, Disk: disk})
	cp := do(r, "etcd, kube-apiserver, kube-controller-manager, kube-scheduler", &ControlPlane{Tools: tools, Credentials: creds})
	if opts.HostListener != nil {
		do(r, "API server on the host's loopback", &Forwarder{Cluster: &cp.Cluster})
	}
	do(r, "cluster DNS (CoreDNS)", &DNS{Tools: tools, Credentials: creds, Cluster: &cp.Cluster})
	do(r, "LAN router (FRR, BGP)", &Router{})
	do(r, "libvirt-cloud-controller-manager", &CCM{Binaries: bins, Cluster: &cp.Cluster})
	// The first answer's pod starts on the first node up while the others
	// come up. It is created once that node is: a pod created before any
	// Node existed was retried by the scheduler 30 s later, not when the
	// nodes came.
	wait := opts.WaitFor(opts.Nodes)
	do(r, "a first node registered, initialized, routed", &WaitNodes{Cluster: &cp.Cluster, Wait: wait, First: true})
	fa := do(r, "first answer's pod and LoadBalancer Service", &FirstAnswer{Cluster: &cp.Cluster, Wait: wait + firstAnswerBound})
	do(r, "nodes registered, initialized, routed", &WaitNodes{Cluster: &cp.Cluster, Wait: wait})
	do(r, lab.FirstAnswerStep, &AwaitFirstAnswer{FirstAnswer: fa})
	if r.err == nil {
		fmt.Fprintf(opts.Out, "lab up in %.1fs\n", time.Since(r.start).Seconds())
		if key != nil && !opts.NoSnapshot {
			do(r, "snapshot for the next up", &TakeSnapshot{Key: key, Credentials: creds})
		}
	}
	fa.stop()
	if r.err != nil {
		return st, r.err
	}
	return st, st.Save()
}

// restore brings the lab of snapshot m up: the host's daemons and network
// as a fresh up starts them, the control plane and the guests as m holds
// them, the CCM as shipped; it ends, as a fresh up does, with the first
// answer through a VIP.
func restore(r *run, m snapshot.Meta, tools *Tools, bins *Binaries) error {
	st, opts := r.env.State, r.env.Opts
	r.env.say("restoring snapshot %s (taken %s; up --fresh boots instead)", m.ID, m.Created.Local().Format(time.DateTime))
	st.Snapshot = m.ID
	do(r, "claim the host's libvirtd", &ClaimHost{})
	do(r, "libvirtd", &Libvirtd{})
	do(r, "DHCP leases from the snapshot", &RestoreLeases{Snapshot: m})
	do(r, fmt.Sprintf("libvirt network %s (%s)", lab.NetworkName, st.IPFamily), &Network{})
	do(r, "multipath hash per connection", &Multipath{})
	do(r, "image registry (labcloud load)", &Registry{})
	creds := do(r, "control plane from the snapshot", &RestoredCredentials{Tools: tools, Snapshot: m})
	guests := do(r, fmt.Sprintf("start restoring %d guests", len(m.Guests)), &RestoreGuests{Snapshot: m})
	defer func() { _ = guests.wait() }() // nothing of the restore runs on after a failure
	cp := do(r, "etcd, kube-apiserver, kube-controller-manager, kube-scheduler", &ControlPlane{Tools: tools, Credentials: &creds.Credentials, Restored: true})
	do(r, "guests restored", &AwaitGuests{RestoreGuests: guests})
	do(r, "leader leases of the snapshot's processes released", &ReleaseLeases{Cluster: &cp.Cluster})
	if opts.HostListener != nil {
		do(r, "API server on the host's loopback", &Forwarder{Cluster: &cp.Cluster})
	}
	do(r, "cluster DNS (CoreDNS)", &DNS{Tools: tools, Credentials: &creds.Credentials, Cluster: &cp.Cluster})
	do(r, "LAN router (FRR, BGP)", &Router{})
	do(r, "libvirt-cloud-controller-manager", &CCM{Binaries: bins, Cluster: &cp.Cluster})
	fa := do(r, lab.FirstAnswerStep, &RestoredAnswer{Cluster: &cp.Cluster, Wait: time.Minute})
	fa.stop()
	if r.err == nil {
		fmt.Fprintf(opts.Out, "lab up in %.1fs (restored from snapshot %s)\n", time.Since(r.start).Seconds(), m.ID)
	}
	return r.err
}

// Light brings the light lab up: simulated nodes on libvirt's test
// driver, renewing their Leases every heartbeat. It runs as root inside
// the lab's namespace; the daemons it starts outlive it.
func Light(ctx context.Context, opts lab.Options) (*lab.State, error) {
	opts.Light = true
	r, err := begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	st, opts := r.env.State, r.env.Opts
	heartbeat := heartbeatFor(opts.Nodes)
	tools := do(r, "control-plane tools", &Tools{})
	// No libvirtd, but the lab's namespace name is the host's one lab.
	do(r, "claim the host", &ClaimHost{})
	bins := do(r, "build CCM", &Binaries{})
	do(r, fmt.Sprintf("test-driver fixture of %d domains", opts.Nodes), &Fixture{})
	cp := do(r, "etcd, kube-apiserver, kube-controller-manager", &LightControlPlane{Tools: tools, Heartbeat: heartbeat})
	if opts.HostListener != nil {
		do(r, "API server on the host's loopback", &Forwarder{Cluster: &cp.Cluster})
	}
	do(r, "libvirt-cloud-controller-manager (test driver)", &CCM{Binaries: bins, Cluster: &cp.Cluster})
	do(r, fmt.Sprintf("simulator of %d nodes", opts.Nodes), &Simulator{ControlPlane: cp, Heartbeat: heartbeat})
	do(r, "nodes registered, initialized", &WaitLight{Cluster: &cp.Cluster, Wait: opts.WaitFor(opts.Nodes)})
	if r.err != nil {
		return st, r.err
	}
	fmt.Fprintf(opts.Out, "light lab up in %.1fs (leases renewed every %s)\n\n", time.Since(r.start).Seconds(), heartbeat)
	if err := st.Save(); err != nil {
		return st, err
	}
	s, err := lab.GetStatus(ctx, st)
	if err != nil {
		return st, err
	}
	s.WriteSummary(opts.Out, 20)
	return st, nil
}
