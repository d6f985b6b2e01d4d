// Package outofservice puts Kubernetes' out-of-service taint on a Node
// whose domain its hypervisors confirm is not running, and takes it off
// when the domain runs again.
//
// The taint is upstream's non-graceful node shutdown: the taint eviction
// controller deletes the Node's pods at once, so they leave every
// EndpointSlice in seconds instead of when the Node turns NotReady (40 s
// and more), and the pod garbage collector force-deletes them and detaches
// their volumes once the Node is NotReady. Upstream leaves the taint to an
// administrator because only someone who knows the machine is off may say
// so; here the hypervisor knows. A hypervisor that cannot be reached
// confirms nothing, so a Node is never tainted for a lost connection.
package outofservice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// The taint this package sets: upstream's key, with a value of its own so
// that a taint an administrator set (value "nodeshutdown" by upstream's
// convention) is never taken off by the CCM.
const (
	TaintKey   = v1.TaintNodeOutOfService
	TaintValue = "libvirt-domain-down"
)

// Event reasons on Nodes.
const (
	ReasonTainted   = "OutOfService"
	ReasonUntainted = "BackInService"
)

// resync re-checks every Node this often, besides the hypervisors' events
// and Node changes: a change missed while a hypervisor was unreachable is
// caught then.
const resync = 30 * time.Second

// Hypervisor is what the controller asks of one; *libvirtcloud.Hypervisor
// is one.
type Hypervisor interface {
	Zone() string
	// DomainByUUID fails with libvirtcloud.ErrNotFound only when the
	// hypervisor says the domain does not exist.
	DomainByUUID(uuid string) (libvirtcloud.Domain, error)
	Subscribe() (<-chan libvirtcloud.Event, func())
}

// Controller keeps the taint in step with the Nodes' domains.
type Controller struct {
	hypervisors []Hypervisor
	uuidOf      func(providerID string) (string, error)
	client      kubernetes.Interface
	nodes       corelisters.NodeLister
	recorder    record.EventRecorder
	queue       workqueue.TypedRateLimitingInterface[string]
}

// New returns a controller over hypervisors; uuidOf reads a domain UUID
// from a Node's providerID.
func New(hypervisors []Hypervisor, uuidOf func(providerID string) (string, error)) *Controller {
	return &Controller{
		hypervisors: hypervisors,
		uuidOf:      uuidOf,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "node-out-of-service"}),
	}
}

// Start watches the Nodes and the hypervisors until ctx ends.
func (c *Controller) Start(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	c.client, c.recorder = client, recorder
	informer := factory.Core().V1().Nodes()
	c.nodes = informer.Lister()
	enqueue := func(obj any) {
		if n, ok := obj.(*v1.Node); ok && n.Spec.ProviderID != "" {
			c.queue.Add(n.Name)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, cur any) { enqueue(cur) },
	}); err != nil {
		return fmt.Errorf("out-of-service taint: watch Nodes: %w", err)
	}
	synced := informer.Informer().HasSynced
	for _, h := range c.hypervisors {
		events, stop := h.Subscribe()
		go func() {
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-events:
					if !ok {
						return
					}
					if synced() {
						c.enqueueDomain(ev.Domain.UUID)
					}
				}
			}
		}()
	}
	go c.run(ctx, synced)
	return nil
}

func (c *Controller) run(ctx context.Context, synced cache.InformerSynced) {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	if !cache.WaitForNamedCacheSync("node-out-of-service", ctx.Done(), synced) {
		return
	}
	go wait.UntilWithContext(ctx, func(context.Context) { c.enqueueAll() }, resync)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for c.next(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
}

// enqueueDomain queues the Nodes whose providerID names the domain.
func (c *Controller) enqueueDomain(uuid string) {
	nodes, _ := c.nodes.List(labels.Everything())
	for _, n := range nodes {
		if u, err := c.uuidOf(n.Spec.ProviderID); err == nil && strings.EqualFold(u, uuid) {
			c.queue.Add(n.Name)
		}
	}
}

func (c *Controller) enqueueAll() {
	nodes, _ := c.nodes.List(labels.Everything())
	for _, n := range nodes {
		if n.Spec.ProviderID != "" {
			c.queue.Add(n.Name)
		}
	}
}

func (c *Controller) next(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if err := c.sync(ctx, name); err != nil {
		klog.FromContext(ctx).Error(err, "Out-of-service taint", "node", name)
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
	return true
}

// sync taints or untaints one Node as its domain's state says.
func (c *Controller) sync(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if err != nil || node.Spec.ProviderID == "" {
		return nil // gone, or not initialized: no domain of its own yet
	}
	uuid, err := c.uuidOf(node.Spec.ProviderID)
	if err != nil {
		return nil // another provider's Node
	}
	d, down, err := Confirm(c.hypervisors, uuid)
	if err != nil {
		return nil // unconfirmed: the next event or resync looks again
	}
	switch taint := taintOf(node); {
	case down && taint == nil:
		if err := c.update(ctx, name, addTaint); err != nil {
			return err
		}
		c.recorder.Eventf(node, v1.EventTypeWarning, ReasonTainted,
			"domain %s is %s on hypervisor %s: tainted %s, so its pods are deleted and leave their Services' endpoints", d.Name, d.State, d.Hypervisor, TaintKey)
		klog.FromContext(ctx).Info("Node out of service: its domain is not running", "node", name, "domain", d.Name, "state", d.State, "hypervisor", d.Hypervisor)
	case !down && taint != nil && taint.Value == TaintValue:
		if err := c.update(ctx, name, removeTaint); err != nil {
			return err
		}
		c.recorder.Eventf(node, v1.EventTypeNormal, ReasonUntainted, "domain %s runs again on hypervisor %s: removed %s", d.Name, d.Hypervisor, TaintKey)
		klog.FromContext(ctx).Info("Node back in service: its domain runs again", "node", name, "domain", d.Name)
	}
	return nil
}

// Confirm says whether the hypervisors confirm the domain is not running:
// every one of them answered, at least one has the domain, and each that
// has it has it shut off or crashed (a domain migrated away stays defined,
// shut off, where it was). It fails if any hypervisor could not answer.
func Confirm(hypervisors []Hypervisor, uuid string) (libvirtcloud.Domain, bool, error) {
	var (
		down  libvirtcloud.Domain
		found bool
	)
	for _, h := range hypervisors {
		d, err := h.DomainByUUID(uuid)
		switch {
		case errors.Is(err, libvirtcloud.ErrNotFound):
			continue
		case err != nil:
			return libvirtcloud.Domain{}, false, err
		case !d.State.Down():
			return d, false, nil
		}
		down, found = d, true
	}
	return down, found, nil
}

// taintOf is the Node's out-of-service taint, whoever set it.
func taintOf(n *v1.Node) *v1.Taint {
	for i, t := range n.Spec.Taints {
		if t.Key == TaintKey {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// addTaint adds the taint unless the Node has one with its key; it
// reports whether it changed the Node.
func addTaint(n *v1.Node) bool {
	if taintOf(n) != nil {
		return false
	}
	n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: TaintKey, Value: TaintValue, Effect: v1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: time.Now()}})
	return true
}

// removeTaint removes the taint if this package set it.
func removeTaint(n *v1.Node) bool {
	before := len(n.Spec.Taints)
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == TaintKey && t.Value == TaintValue })
	return len(n.Spec.Taints) != before
}

// update applies change to the Node as the API server has it now,
// retrying on conflicts.
func (c *Controller) update(ctx context.Context, name string, change func(*v1.Node) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !change(n) {
			return nil
		}
		_, err = c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}
