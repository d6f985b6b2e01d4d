// Package nodeagent is lab-node: the stand-in for kubelet and kube-proxy in
// a lab guest. It registers its Node like a kubelet with
// --cloud-provider=external, heartbeats, puts the first address of each pod
// CIDR on a dummy interface, and serves HTTP on the LoadBalancer VIPs,
// answering with its node name.
//
// Every request is one a kubelet may make under the Node authorizer, the
// NodeRestriction admission plugin and the system:node rules:
//   - nodes: create its own Node (with the uninitialized taint: taints may
//     be set at creation only), get it, patch its labels (only the
//     kubernetes.io/hostname, os and arch ones and configured extras; never
//     taints), list/watch it with the field selector metadata.name=<node>;
//   - nodes/status: patch its own;
//   - leases in kube-node-lease: get, create, update the one named after
//     the node;
//   - services: list and watch, cluster-wide.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Options configure an Agent. NodeName, Client and Interfaces are
// required; the rest has defaults.
type Options struct {
	NodeName string
	// Labels are extra labels for the Node (see nodeconfig.Config.Labels).
	Labels map[string]string
	// Client talks to the API server with the node's credentials.
	Client kubernetes.Interface
	// Interfaces changes the guest's addresses.
	Interfaces Interfaces
	// Host is reported in the Node's status.
	Host Host
	// Listen opens the VIP listeners; net.ListenConfig.Listen if nil.
	Listen ListenFunc
	// ProbeAddr is where the reachability probe (see Probe) listens, e.g.
	// "0.0.0.0:9099"; empty means no probe.
	ProbeAddr string

	// LeaseRenewInterval is how often the Lease is renewed (10 s).
	LeaseRenewInterval time.Duration
	// StatusRefresh is how old the Ready heartbeat may get before it is
	// refreshed (1 min). The Lease is what the node lifecycle controller
	// watches; status is reported when it changes and on this slow timer,
	// as a kubelet does.
	StatusRefresh time.Duration
	// ResyncInterval is how often the addresses and listeners are checked
	// against the wanted state even without events (30 s).
	ResyncInterval time.Duration
	// RequestTimeout bounds each API request (15 s).
	RequestTimeout time.Duration
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// Agent is one lab-node.
type Agent struct {
	opts   Options
	server *NameServer

	mu   sync.Mutex
	node *v1.Node // last Node returned by the API server
}

// New checks the options and fills in defaults.
func New(opts Options) (*Agent, error) {
	var errs []error
	if opts.NodeName == "" {
		errs = append(errs, errors.New("NodeName is empty"))
	}
	if opts.Client == nil {
		errs = append(errs, errors.New("Client is nil"))
	}
	if opts.Interfaces == nil {
		errs = append(errs, errors.New("Interfaces is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("nodeagent options: %w", err)
	}
	setDefault(&opts.LeaseRenewInterval, 10*time.Second)
	setDefault(&opts.StatusRefresh, time.Minute)
	setDefault(&opts.ResyncInterval, 30*time.Second)
	setDefault(&opts.RequestTimeout, 15*time.Second)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Agent{opts: opts, server: NewNameServer(opts.NodeName, opts.Listen)}, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Run registers the Node (retrying until the API server answers), then
// heartbeats and keeps the pod addresses and VIPs in line with the cluster
// until ctx ends. It returns nil when ctx ends; every goroutine it started
// has stopped and every listener is closed by then.
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", a.opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	defer a.server.Close()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // first: whatever Run started stops on every return
	if a.opts.ProbeAddr != "" {
		// Up before registration: reachability does not depend on the API server.
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", a.opts.ProbeAddr)
		if err != nil {
			return fmt.Errorf("probe listener on %s: %w", a.opts.ProbeAddr, err)
		}
		logger.Info("Serving reachability probe", "address", ln.Addr())
		// Peers listen on the same port as this node.
		probe := NewProbe(a.opts.NodeName, ln.Addr().(*net.TCPAddr).Port)
		wg.Go(func() { ServeProbe(ctx, ln, probe) })
	}

	if _, err := a.register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	nodeFactory := informers.NewSharedInformerFactoryWithOptions(a.opts.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.opts.NodeName).String()
		}))
	svcFactory := informers.NewSharedInformerFactory(a.opts.Client, 0)
	nodes := nodeFactory.Core().V1().Nodes()
	services := svcFactory.Core().V1().Services()

	netTrigger := make(chan struct{}, 1)
	statusTrigger := make(chan struct{}, 1)
	if _, err := nodes.Informer().AddEventHandler(triggerHandler(netTrigger, statusTrigger)); err != nil {
		return fmt.Errorf("watch node: %w", err)
	}
	if _, err := services.Informer().AddEventHandler(triggerHandler(netTrigger)); err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	nodeFactory.Start(ctx.Done())
	svcFactory.Start(ctx.Done())
	defer nodeFactory.Shutdown()
	defer svcFactory.Shutdown()

	netw := &networkSync{
		name:        a.opts.NodeName,
		ifs:         a.opts.Interfaces,
		server:      a.server,
		nodes:       nodes.Lister(),
		nodesSynced: nodes.Informer().HasSynced,
		svcs:        services.Lister(),
		svcsSynced:  services.Informer().HasSynced,
	}
	wg.Go(func() {
		// Informers that synced empty deliver no event: sync once they have.
		if cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced, services.Informer().HasSynced) {
			poke(netTrigger, statusTrigger)
		}
	})
	wg.Go(func() { loop(ctx, netTrigger, a.opts.ResyncInterval, netw.sync) })
	wg.Go(func() { a.runLease(ctx) })
	wg.Go(func() {
		loop(ctx, statusTrigger, a.opts.LeaseRenewInterval, func(ctx context.Context) error {
			return a.syncStatus(ctx, nodes.Lister(), nodes.Informer().HasSynced)
		})
	})
	wg.Wait()
	return nil
}

// poke wakes the loops waiting on chs without blocking.
func poke(chs ...chan struct{}) {
	for _, ch := range chs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// triggerHandler pokes every channel on any event.
func triggerHandler(chs ...chan struct{}) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(chs...) },
		UpdateFunc: func(any, any) { poke(chs...) },
		DeleteFunc: func(any) { poke(chs...) },
	}
}

// loop runs sync on every trigger and every interval; a failed sync is
// retried with backoff (1 s doubling up to interval) and logged.
func loop(ctx context.Context, trigger <-chan struct{}, interval time.Duration, sync func(context.Context) error) {
	logger := klog.FromContext(ctx)
	backoff := retryBackoff(interval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		case <-timer.C:
		}
		next := interval
		if err := sync(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			next = backoff.Step()
			logger.Error(err, "Sync failed; retrying", "after", next)
		} else {
			backoff = retryBackoff(interval)
		}
		timer.Reset(next)
	}
}

func retryBackoff(limit time.Duration) wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: limit}
}

func (a *Agent) setNode(n *v1.Node) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node = n
}

func (a *Agent) lastNode() *v1.Node {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.node
}

func (a *Agent) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.opts.RequestTimeout)
}

// register creates the Node, or brings an existing one up to date, retrying
// with backoff until it succeeds or ctx ends.
func (a *Agent) register(ctx context.Context) (*v1.Node, error) {
	logger := klog.FromContext(ctx)
	backoff := retryBackoff(15 * time.Second)
	for {
		node, err := a.tryRegister(ctx)
		if err == nil {
			a.setNode(node)
			return node, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d := backoff.Step()
		logger.Error(err, "Unable to register node with the API server; retrying", "after", d)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(d):
		}
	}
}

func (a *Agent) tryRegister(ctx context.Context) (*v1.Node, error) {
	logger := klog.FromContext(ctx)
	nodesAPI := a.opts.Client.CoreV1().Nodes()
	want := NewNode(a.opts.NodeName, a.opts.Labels, a.opts.Host, a.opts.Now())
	cctx, cancel := a.callCtx(ctx)
	created, err := nodesAPI.Create(cctx, want, metav1.CreateOptions{})
	cancel()
	if err == nil {
		logger.Info("Registered node", "uid", created.UID, "systemUUID", a.opts.Host.SystemUUID)
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create node %s: %w", a.opts.NodeName, err)
	}
	cctx, cancel = a.callCtx(ctx)
	defer cancel()
	node, err := nodesAPI.Get(cctx, a.opts.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get existing node %s: %w", a.opts.NodeName, err)
	}
	patch, err := LabelPatch(node, a.opts.Labels)
	if err != nil {
		return nil, err
	}
	if patch != nil {
		if node, err = nodesAPI.Patch(cctx, a.opts.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("patch labels of node %s: %w", a.opts.NodeName, err)
		}
	}
	if node, err = a.patchStatus(cctx, node); err != nil {
		return nil, err
	}
	logger.Info("Node already registered; updated it", "uid", node.UID, "systemUUID", a.opts.Host.SystemUUID)
	return node, nil
}

// patchStatus sends the status patch due for node, if any, and returns the
// newest Node.
func (a *Agent) patchStatus(ctx context.Context, node *v1.Node) (*v1.Node, error) {
	patch, err := StatusPatch(node, a.opts.Host, a.opts.Now(), a.opts.StatusRefresh)
	if err != nil || patch == nil {
		return node, err
	}
	updated, err := a.opts.Client.CoreV1().Nodes().PatchStatus(ctx, a.opts.NodeName, patch)
	if err != nil {
		return nil, fmt.Errorf("patch status of node %s: %w", a.opts.NodeName, err)
	}
	klog.FromContext(ctx).V(4).Info("Patched node status", "patch", string(patch))
	return updated, nil
}

// syncStatus reports status when due. It prefers the informer's copy of the
// Node (fresh after changes by others) over the last one the API returned.
// A Node deleted behind lab-node's back is registered again.
func (a *Agent) syncStatus(ctx context.Context, lister corelisters.NodeLister, synced cache.InformerSynced) error {
	node := a.lastNode()
	if node == nil {
		return nil
	}
	cctx, cancel := a.callCtx(ctx)
	defer cancel()
	var err error
	if synced() {
		cached, lerr := lister.Get(a.opts.NodeName)
		switch {
		case lerr == nil:
			if cached.ResourceVersion != node.ResourceVersion {
				node = cached
			}
		case apierrors.IsNotFound(lerr):
			// Deleted, or not in the cache yet: ask.
			node, err = a.opts.Client.CoreV1().Nodes().Get(cctx, a.opts.NodeName, metav1.GetOptions{})
		}
	}
	var updated *v1.Node
	if err == nil {
		updated, err = a.patchStatus(cctx, node)
	}
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Info("Node was deleted; registering it again")
		a.setNode(nil)
		updated, err = a.tryRegister(ctx)
	}
	if err != nil {
		return err
	}
	a.setNode(updated)
	return nil
}

// runLease renews the node Lease every LeaseRenewInterval, retrying
// failures sooner.
func (a *Agent) runLease(ctx context.Context) {
	var lease *coordinationv1.Lease
	loop(ctx, nil, a.opts.LeaseRenewInterval, func(ctx context.Context) error {
		var err error
		lease, err = a.renewLease(ctx, lease)
		return err
	})
}

// renewLease writes a renewed Lease based on cur (nil: read it first) and
// returns the stored Lease, or nil after a failure so the next attempt reads
// it again.
func (a *Agent) renewLease(ctx context.Context, cur *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	node := a.lastNode()
	if node == nil {
		return nil, nil // being registered again
	}
	leases := a.opts.Client.CoordinationV1().Leases(NodeLeaseNamespace)
	cctx, cancel := a.callCtx(ctx)
	defer cancel()
	if cur == nil {
		got, err := leases.Get(cctx, a.opts.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(cctx, RenewedLease(nil, node, a.opts.Now()), metav1.CreateOptions{})
			if err != nil {
				return nil, fmt.Errorf("create lease %s/%s: %w", NodeLeaseNamespace, a.opts.NodeName, err)
			}
			klog.FromContext(ctx).Info("Created node lease")
			return created, nil
		case err != nil:
			return nil, fmt.Errorf("get lease %s/%s: %w", NodeLeaseNamespace, a.opts.NodeName, err)
		}
		cur = got
	}
	updated, err := leases.Update(cctx, RenewedLease(cur, node, a.opts.Now()), metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("renew lease %s/%s: %w", NodeLeaseNamespace, a.opts.NodeName, err)
	}
	return updated, nil
}

// networkSync applies the pod addresses and VIPs.
type networkSync struct {
	name        string
	ifs         Interfaces
	server      *NameServer
	nodes       corelisters.NodeLister
	nodesSynced cache.InformerSynced
	svcs        corelisters.ServiceLister
	svcsSynced  cache.InformerSynced
}

// sync brings pod0, lo and the listeners in line with the informers'
// view. A part whose informer has not synced yet is left alone, so nothing
// is removed on the strength of an empty cache.
func (n *networkSync) sync(ctx context.Context) error {
	var errs []error
	if n.nodesSynced() {
		node, err := n.nodes.Get(n.name)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("get node from cache: %w", err)
		}
		if err := n.ifs.EnsureDummy(PodInterface); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, syncAddrs(ctx, n.ifs, PodInterface, PodAddresses(NodePodCIDRs(node)), OwnedOnPod0))
		}
	}
	if n.svcsSynced() {
		svcs, err := n.svcs.List(labels.Everything())
		if err != nil {
			return fmt.Errorf("list services from cache: %w", err)
		}
		plan := PlanVIPs(svcs)
		start, stop := ListenerDiff(n.server.Listening(), plan.Listeners)
		n.server.Stop(ctx, stop) // before their addresses go
		errs = append(errs, syncAddrs(ctx, n.ifs, VIPInterface, VIPPrefixes(plan.Addrs), OwnedOnLo))
		errs = append(errs, n.server.Start(ctx, start))
	}
	return errors.Join(errs...)
}

// syncAddrs applies AddrDiff to one interface: deletions first.
func syncAddrs(ctx context.Context, ifs Interfaces, ifname string, want []netip.Prefix, owned func(netip.Prefix) bool) error {
	logger := klog.FromContext(ctx)
	cur, err := ifs.Addrs(ifname)
	if err != nil {
		return err
	}
	add, del := AddrDiff(cur, want, owned)
	var errs []error
	for _, p := range del {
		if err := ifs.DelAddr(ifname, p); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.Info("Removed address", "interface", ifname, "address", p)
	}
	for _, p := range add {
		if err := ifs.AddAddr(ifname, p); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.Info("Added address", "interface", ifname, "address", p)
	}
	return errors.Join(errs...)
}
