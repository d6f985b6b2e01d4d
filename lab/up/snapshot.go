package up

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/guest"
	"github.com/labcloud/labcloud/lab/snapshot"
)

// snapshotKey is everything that shapes a booted lab: the options that
// change what runs, the tools, the guests' kernel and disk (content
// hashes), the cloud config, and labcloud itself.
func snapshotKey(env *Env, tools *Tools, img *BootImage, disk *RootDisk) (snapshot.Key, error) {
	opts, st := env.Opts, env.State
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	labcloud, err := fileHash(self)
	if err != nil {
		return nil, err
	}
	cloudConfig := ""
	if opts.CloudConfig != "" {
		if cloudConfig, err = fileHash(opts.CloudConfig); err != nil {
			return nil, err
		}
	}
	addr, _ := json.Marshal(st.Addressing)
	accel, _ := guest.ChooseAccel(guest.GatherEvidence())
	return snapshot.Key{
		// A KVM guest's state holds the host CPU's features (host
		// passthrough): another CPU may not run it.
		"accel":       accel,
		"cpu":         cpuModel(),
		"nodes":       strconv.Itoa(opts.Nodes),
		"hosts":       strconv.Itoa(len(st.Hosts)),
		"ipFamily":    string(st.IPFamily),
		"routed":      strconv.FormatBool(st.Routed),
		"addressing":  string(addr),
		"insecure":    strings.Join(st.InsecureRegistries, ","),
		"ccmFlags":    strings.Join(opts.CCMFlags, " "),
		"cloudConfig": cloudConfig,
		"tools":       filepath.Base(tools.Dir),
		"image":       img.Artifacts.Key,
		"disk":        disk.Disk.Key,
		"labcloud":    labcloud,
	}, nil
}

// cpuModel is the host CPU's model name, as /proc/cpuinfo gives it.
func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// snapshotsFit says whether a lab of these options can be snapshotted:
// one host (the guests of other hosts live in libvirtds up starts anew).
func snapshotsFit(st *lab.State) bool { return len(st.Hosts) == 1 }

// What a snapshot holds besides the guests' memory.
const (
	snapControlPlane = "controlplane" // the control plane's directory, etcd's data in it
	snapNodes        = "nodes"        // the guests' initrds, which QEMU reads at start
	snapLeases       = "leases"       // the network's DHCP leases
	snapCredentials  = "credentials.json"
)

// leasesFile is where libvirt keeps the DHCP leases of the lab's network.
func leasesFile() string { return filepath.Join("/var/lib/libvirt/dnsmasq", lab.Bridge+".status") }

// TakeSnapshot saves the booted lab for the next up of the same key, while
// the first answer's pod and Service still exist: a restored lab answers
// through them. The guests run on; etcd is stopped for the copy.
type TakeSnapshot struct {
	Key         snapshot.Key
	Credentials *Credentials
	Size        int64 // made: bytes on disk
}

func (a *TakeSnapshot) Execute(_ context.Context, env *Env) error {
	st := env.State
	w, err := lab.Snapshots().Begin(a.Key)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			w.Abort()
		}
	}()
	c, err := libvirt.NewConnect(st.Hosts[0].URI)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := w.SaveGuests(c, st.Nodes); err != nil {
		return err
	}
	if err := w.SaveDir(snapControlPlane, filepath.Join(st.Dir, "controlplane"), st.Pids["etcd"]); err != nil {
		return err
	}
	if err := w.SaveFiles(snapNodes, initrds(st)...); err != nil {
		return err
	}
	if err := w.SaveFiles(snapLeases, leasesFile()); err != nil {
		return err
	}
	if err := w.SaveJSON(snapCredentials, savedCredentials{Kubelets: a.Credentials.Kubelets, ProxyToken: a.Credentials.ProxyToken, DNSToken: a.Credentials.DNSToken}); err != nil {
		return err
	}
	m, err := w.Commit(st.Nodes)
	if err != nil {
		return err
	}
	ok = true
	a.Size = m.Bytes
	env.say("snapshot %s: %d guests, %.0f MiB in %s (labcloud snapshot list)", m.ID, len(m.Guests), float64(m.Bytes)/(1<<20), lab.Snapshots().Path(m.ID))
	return nil
}

// initrds are the guests' initrd files.
func initrds(st *lab.State) []string {
	var out []string
	for _, n := range st.Nodes {
		out = append(out, filepath.Join(st.Dir, "nodes", n+".initrd"))
	}
	return out
}

// savedCredentials are the tokens Credentials made, which the restored
// control plane's tokens.csv and the guests hold.
type savedCredentials struct {
	Kubelets   []controlplane.Token `json:"kubelets"`
	ProxyToken string               `json:"proxyToken"`
	DNSToken   string               `json:"dnsToken"`
}

// RestoredCredentials is Credentials from a snapshot: the control plane's
// directory (etcd's data, certificates, keys, kubeconfigs) and the tokens,
// as they were when it was taken.
type RestoredCredentials struct {
	Tools    *Tools
	Snapshot snapshot.Meta
	Credentials
}

func (a *RestoredCredentials) Execute(_ context.Context, env *Env) error {
	st, store := env.State, lab.Snapshots()
	dir := filepath.Join(st.Dir, "controlplane")
	if err := store.RestoreDir(a.Snapshot, snapControlPlane, dir); err != nil {
		return err
	}
	var saved savedCredentials
	if err := store.ReadJSON(a.Snapshot, snapCredentials, &saved); err != nil {
		return err
	}
	a.Kubelets, a.ProxyToken, a.DNSToken = saved.Kubelets, saved.ProxyToken, saved.DNSToken
	ad := env.addresses()
	var err error
	a.ControlPlane, err = controlplane.Reopen(controlplane.Options{
		Tools: a.Tools.Dir, Dir: dir, Port: lab.APIPort, Daemon: true,
		Address: ad.APIAddress(), AltIPs: []string{ad.Gateway(), lab.Gateway6},
		ClusterCIDR: strings.Join(ad.ClusterCIDRs(), ","), NodeCIDRMaskSizeIPv6: lab.NodeMaskSize6,
		ServiceCIDR: strings.Join(ad.ServiceCIDRs(), ","), Scheduler: true,
	})
	return err
}

// RestoreLeases puts the network's DHCP leases back before the network
// starts: the CCM reads the guests' addresses there, and a restored guest
// renews its lease only when it is due.
type RestoreLeases struct {
	Snapshot snapshot.Meta
}

func (a *RestoreLeases) Execute(context.Context, *Env) error {
	return lab.Snapshots().RestoreFiles(a.Snapshot, snapLeases, filepath.Dir(leasesFile()))
}

// RestoreGuests starts restoring the guests from their memory as the
// snapshot holds it, with the files QEMU reads at start put back first,
// and records them in the state. The restore runs beside the control
// plane's start (a guest's kubelet retries until the API server answers);
// AwaitGuests has its result.
type RestoreGuests struct {
	Snapshot snapshot.Meta
	done     chan struct{} // made: closed when the restore is over
	err      error         // the restore's result, once done is closed
}

func (a *RestoreGuests) Execute(_ context.Context, env *Env) error {
	st, store := env.State, lab.Snapshots()
	nodes := filepath.Join(st.Dir, "nodes")
	if err := os.MkdirAll(nodes, 0o700); err != nil {
		return err
	}
	if err := store.RestoreFiles(a.Snapshot, snapNodes, nodes); err != nil {
		return err
	}
	c, err := libvirt.NewConnect(st.Hosts[0].URI)
	if err != nil {
		return err
	}
	st.Nodes = append(st.Nodes, a.Snapshot.Guests...)
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		defer c.Close()
		a.err = store.RestoreGuests(c, a.Snapshot)
	}()
	return nil
}

// wait returns the restore's result, once it is over (nil if it never
// started).
func (a *RestoreGuests) wait() error {
	if a.done == nil {
		return nil
	}
	<-a.done
	return a.err
}

// AwaitGuests waits for RestoreGuests to end.
type AwaitGuests struct {
	RestoreGuests *RestoreGuests
}

func (a *AwaitGuests) Execute(context.Context, *Env) error { return a.RestoreGuests.wait() }

// ErrRestoreFailed is a restore that did not finish. The snapshot is
// removed; what the restore made is for the caller to remove (labcloud up
// then boots: never a half-restored cluster).
var ErrRestoreFailed = errors.New("restoring the lab's snapshot failed")

func restoreFailed(env *Env, m snapshot.Meta, err error) error {
	env.say("restoring snapshot %s failed: %v; removing it", m.ID, err)
	if rerr := lab.Snapshots().Remove(m.ID); rerr != nil {
		env.say("%v", rerr)
	}
	return fmt.Errorf("%w: %w", ErrRestoreFailed, err)
}

// ReleaseLeases deletes the leader-election Leases the snapshot's
// processes held: their holders are gone, and a new candidate waits a
// whole lease duration (15 s) on a holder it has not seen renew.
type ReleaseLeases struct {
	Cluster *Cluster
}

func (a *ReleaseLeases) Execute(ctx context.Context, _ *Env) error {
	leases := a.Cluster.Client.CoordinationV1().Leases("kube-system")
	for _, name := range []string{"cloud-controller-manager", "kube-controller-manager", "kube-scheduler"} {
		if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("lease kube-system/%s: %w", name, err)
		}
	}
	return nil
}
