// Package lbclass serves the LoadBalancer Services of one
// loadBalancerClass through a cloudprovider.LoadBalancer, beside the
// upstream service controller, which serves only Services without a
// class. It does what the upstream controller does for its Services: the
// cleanup finalizer, EnsureLoadBalancer, the status, and the release when
// the Service goes; Services of any other class are never touched.
package lbclass

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/api"
	servicehelper "k8s.io/cloud-provider/service/helpers"
	"k8s.io/klog/v2"
)

// Event reasons of the controller.
const (
	ReasonEnsured = "EnsuredLoadBalancer"
	ReasonFailed  = "SyncLoadBalancerFailed"
	ReasonDeleted = "DeletedLoadBalancer"
)

// Retries back off from minRetry to maxRetry, as the upstream service
// controller's do; a Service whose error says when to retry (api.RetryError)
// is retried then.
const (
	minRetry = 5 * time.Second
	maxRetry = 5 * time.Minute
)

// Controller serves the Services of one class.
type Controller struct {
	class       string
	clusterName string
	balancer    cloudprovider.LoadBalancer
	client      kubernetes.Interface
	services    corelisters.ServiceLister
	synced      cache.InformerSynced
	recorder    record.EventRecorder
	queue       workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	failed map[string]string // Service key → the error last reported, so a retry that fails alike is not news
}

// New returns a controller for the Services of class, fed by informer.
func New(class, clusterName string, balancer cloudprovider.LoadBalancer, client kubernetes.Interface, informer coreinformers.ServiceInformer, recorder record.EventRecorder) (*Controller, error) {
	if class == "" {
		return nil, errors.New("lbclass: no class")
	}
	c := &Controller{
		class: class, clusterName: clusterName, balancer: balancer, client: client,
		services: informer.Lister(), synced: informer.Informer().HasSynced, recorder: recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](minRetry, maxRetry),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "service-lb-class"}),
		failed: map[string]string{},
	}
	_, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueIfOurs,
		UpdateFunc: func(old, cur any) { c.enqueueIfOurs(old); c.enqueueIfOurs(cur) },
		DeleteFunc: c.enqueueIfOurs,
	})
	if err != nil {
		return nil, fmt.Errorf("lbclass: watch Services: %w", err)
	}
	return c, nil
}

// ours reports whether svc is of the controller's class.
func (c *Controller) ours(svc *v1.Service) bool {
	return svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass == c.class
}

func (c *Controller) enqueueIfOurs(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	svc, ok := obj.(*v1.Service)
	if !ok || !c.ours(svc) {
		return
	}
	if key, err := cache.MetaNamespaceKeyFunc(svc); err == nil {
		c.queue.Add(key)
	}
}

// Run serves until ctx ends, with workers Services synced at once.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	log := klog.FromContext(ctx).WithValues("class", c.class)
	log.Info("Serving LoadBalancer Services of a class")
	if !cache.WaitForNamedCacheSync("service-lb-class", ctx.Done(), c.synced) {
		return
	}
	for range workers {
		go wait.UntilWithContext(ctx, c.work, time.Second)
	}
	<-ctx.Done()
}

func (c *Controller) work(ctx context.Context) {
	for c.next(ctx) {
	}
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.sync(ctx, key)
	var retry *api.RetryError
	switch {
	case err == nil:
		c.queue.Forget(key)
	case errors.As(err, &retry):
		c.queue.AddAfter(key, retry.RetryAfter())
	default:
		c.queue.AddRateLimited(key)
	}
	return true
}

// sync brings one Service's load balancer in line with the Service.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forget(key)
		return nil // gone: the finalizer saw to its addresses
	}
	if err != nil {
		return err
	}
	if svc.DeletionTimestamp != nil || svc.Spec.Type != v1.ServiceTypeLoadBalancer || !c.ours(svc) {
		return c.release(ctx, key, svc)
	}
	if err := c.addFinalizer(svc); err != nil {
		return fmt.Errorf("add the cleanup finalizer to %s: %w", key, err)
	}
	status, err := c.balancer.EnsureLoadBalancer(ctx, c.clusterName, svc, nil)
	if err != nil {
		c.reportFailure(svc, key, err)
		return err
	}
	c.forget(key)
	if servicehelper.LoadBalancerStatusEqual(&svc.Status.LoadBalancer, status) {
		return nil
	}
	updated := svc.DeepCopy()
	updated.Status.LoadBalancer = *status
	if _, err := servicehelper.PatchService(c.client.CoreV1(), svc, updated); err != nil {
		return fmt.Errorf("write the status of %s: %w", key, err)
	}
	c.recorder.Event(svc, v1.EventTypeNormal, ReasonEnsured, "Ensured load balancer")
	return nil
}

// release gives back what svc holds and lets it go: its status emptied
// (unless it is being deleted) and the finalizer removed.
func (c *Controller) release(ctx context.Context, key string, svc *v1.Service) error {
	if !servicehelper.HasLBFinalizer(svc) {
		return nil
	}
	if err := c.balancer.EnsureLoadBalancerDeleted(ctx, c.clusterName, svc); err != nil && !errors.Is(err, cloudprovider.ImplementedElsewhere) {
		c.reportFailure(svc, key, err)
		return err
	}
	updated := svc.DeepCopy()
	if svc.DeletionTimestamp == nil {
		updated.Status.LoadBalancer = v1.LoadBalancerStatus{}
	}
	updated.Finalizers = slices.DeleteFunc(updated.Finalizers, func(f string) bool { return f == servicehelper.LoadBalancerCleanupFinalizer })
	if _, err := servicehelper.PatchService(c.client.CoreV1(), svc, updated); err != nil {
		return fmt.Errorf("release %s: %w", key, err)
	}
	c.forget(key)
	c.recorder.Event(svc, v1.EventTypeNormal, ReasonDeleted, "Deleted load balancer")
	return nil
}

func (c *Controller) addFinalizer(svc *v1.Service) error {
	if servicehelper.HasLBFinalizer(svc) {
		return nil
	}
	updated := svc.DeepCopy()
	updated.Finalizers = append(updated.Finalizers, servicehelper.LoadBalancerCleanupFinalizer)
	_, err := servicehelper.PatchService(c.client.CoreV1(), svc, updated)
	return err
}

// reportFailure records one Warning per distinct error of a Service: a
// retry that fails alike is not news.
func (c *Controller) reportFailure(svc *v1.Service, key string, err error) {
	msg := err.Error()
	c.mu.Lock()
	seen := c.failed[key] == msg
	c.failed[key] = msg
	c.mu.Unlock()
	if !seen {
		c.recorder.Eventf(svc, v1.EventTypeWarning, ReasonFailed, "Error syncing load balancer: %s", msg)
	}
}

func (c *Controller) forget(key string) {
	c.mu.Lock()
	delete(c.failed, key)
	c.mu.Unlock()
}
