package kubeletsim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// SimOptions configure Simulate.
type SimOptions struct {
	// Client acts for every simulated kubelet.
	Client kubernetes.Interface
	// Nodes is how many nodes to simulate.
	Nodes int
	// Identity names node i (1-based) and gives the system UUID of its
	// domain, which the node reports.
	Identity func(i int) (name, systemUUID string)
	// Heartbeat is how often each node's Lease is renewed (default 10 s).
	Heartbeat time.Duration
	// Workers is how many requests are in flight at most (default 16).
	Workers int
}

// SimClient is the simulator's API client: rate limits that let it
// register thousands of nodes in seconds.
func SimClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("simulator kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst, cfg.UserAgent = 300, 600, "labcloud-simulator"
	return kubernetes.NewForConfig(cfg)
}

// Simulate stands in for the kubelets of the light lab's nodes: it
// registers each Node as a kubelet with --cloud-provider=external does
// (uninitialized taint, system UUID of its domain, Ready) with its Lease,
// then renews every Lease once per Heartbeat, spread evenly over it, until
// ctx ends. The Ready condition is not refreshed: the node lifecycle
// controller takes a renewed Lease as the heartbeat.
func Simulate(ctx context.Context, opts SimOptions) error {
	if opts.Nodes < 1 || opts.Client == nil || opts.Identity == nil {
		return fmt.Errorf("simulate: want a client, an identity and at least one node, got %d nodes", opts.Nodes)
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 10 * time.Second
	}
	if opts.Workers <= 0 {
		opts.Workers = 16
	}
	s := &simulator{opts: opts}
	logger := klog.FromContext(ctx)
	start := time.Now()
	s.each(ctx, func(ctx context.Context, jobs chan<- int) {
		for i := 1; i <= opts.Nodes; i++ {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}, s.registerUntilDone)
	if ctx.Err() != nil {
		return nil
	}
	logger.Info("Registered nodes", "nodes", opts.Nodes, "seconds", time.Since(start).Seconds(), "heartbeat", opts.Heartbeat)
	s.each(ctx, s.schedule, s.renew)
	return nil
}

type simulator struct {
	opts   SimOptions
	failed atomic.Int64 // renewals failed since the last report
}

// each runs produce and opts.Workers workers that do every job it sends,
// and returns when produce has returned and the workers are done.
func (s *simulator) each(ctx context.Context, produce func(context.Context, chan<- int), work func(context.Context, int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range s.opts.Workers {
		wg.Go(func() {
			for i := range jobs {
				work(ctx, i)
			}
		})
	}
	produce(ctx, jobs)
	close(jobs)
	wg.Wait()
}

func (s *simulator) name(i int) string { name, _ := s.opts.Identity(i); return name }

// host is what simulated node i reports about itself.
func (s *simulator) host(i int) Host {
	_, uuid := s.opts.Identity(i)
	return Host{
		SystemUUID:    uuid,
		MachineID:     strings.ReplaceAll(uuid, "-", ""),
		BootID:        uuid,
		KernelVersion: "simulated",
		CPUs:          2,
		MemoryBytes:   2 << 30,
	}
}

// registerUntilDone registers node i, retrying with backoff until it
// succeeds or ctx ends.
func (s *simulator) registerUntilDone(ctx context.Context, i int) {
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 10*time.Second) {
		err := s.register(ctx, i)
		if err == nil || ctx.Err() != nil {
			return
		}
		klog.FromContext(ctx).Error(err, "Registering node failed; retrying", "after", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// register creates node i and its Lease; either may exist already.
func (s *simulator) register(ctx context.Context, i int) error {
	name := s.name(i)
	nodes := s.opts.Client.CoreV1().Nodes()
	node, err := nodes.Create(ctx, NewNode(name, s.host(i), time.Now()), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		node, err = nodes.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", name, err)
	}
	lease := RenewedLease(nil, node, time.Now())
	_, err = s.opts.Client.CoordinationV1().Leases(NodeLeaseNamespace).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create lease of node %s: %w", name, err)
	}
	return nil
}

// renew moves node i's Lease renewTime to now; a Lease that is gone (its
// Node was deleted) is registered again, as a kubelet would.
func (s *simulator) renew(ctx context.Context, i int) {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(time.Now())}})
	if err == nil {
		_, err = s.opts.Client.CoordinationV1().Leases(NodeLeaseNamespace).Patch(ctx, s.name(i), types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if apierrors.IsNotFound(err) {
		err = s.register(ctx, i)
	}
	if err != nil && ctx.Err() == nil {
		s.failed.Add(1)
		klog.FromContext(ctx).V(2).Info("Renewing lease failed", "node", s.name(i), "err", err)
	}
}

// schedule sends each node to be renewed once per Heartbeat, node i at
// offset (i-1)/Nodes of it, so renewals trickle in at an even rate. Failed
// renewals are reported once per round.
func (s *simulator) schedule(ctx context.Context, jobs chan<- int) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var sent int64
	for round := int64(0); ; {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for due := renewalsDue(time.Since(start), s.opts.Heartbeat, s.opts.Nodes); sent < due; sent++ {
			select {
			case jobs <- int(sent%int64(s.opts.Nodes)) + 1:
			case <-ctx.Done():
				return
			}
		}
		if r := sent / int64(s.opts.Nodes); r != round {
			round = r
			if n := s.failed.Swap(0); n > 0 {
				klog.FromContext(ctx).Info("Some lease renewals failed this round", "failed", n, "nodes", s.opts.Nodes)
			}
		}
	}
}

// renewalsDue is how many renewals are due elapsed after the start when n
// Leases are renewed once per interval each, evenly spaced (the first one
// at once).
func renewalsDue(elapsed, interval time.Duration, n int) int64 {
	if elapsed < 0 || n <= 0 {
		return 0
	}
	// Milliseconds keep elapsed*n far from overflowing for years.
	ms := max(int64(interval/time.Millisecond), 1)
	return int64(elapsed/time.Millisecond)*int64(n)/ms + 1
}
