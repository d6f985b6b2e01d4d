package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
)

// Placement you can see: every LoadBalancer Service holding a claimed VIP
// carries the condition lb.ConditionAnnounced, saying which node answers
// for each of its VIPs (True, Announced) or that none can (False,
// NoEligibleNode), with lastTransitionTime = since when. After each pass
// placement hands conditions what every Service's condition should be; a
// small queue writes those that differ from the Service as cached, with a
// strategic merge patch of status.conditions keyed by type: it touches this
// one condition and nothing else (not status.loadBalancer, which the
// service controller owns, nor other conditions). A Service that no longer
// holds a claimed VIP loses the condition. Nothing is written at steady
// state. Placement runs only in the leader, so only the leader writes.

// conditionWorkers write conditions in parallel (one patch each).
const conditionWorkers = 4

// CacheLag bounds how long a Service cache may lag behind a write of the
// Announced condition: within it, a cached condition that differs from
// what placement just wrote is the old one, and is not written again;
// after it, the difference is someone else's change, and the condition is
// restored.
const CacheLag = 10 * time.Second

type conditions struct {
	client   kubernetes.Interface
	services corelisters.ServiceLister

	mu    sync.Mutex
	queue workqueue.TypedRateLimitingInterface[string] // nil until run
	// want is each queued Service's condition to write; nil removes it.
	want map[string]*metav1.Condition
	// written is the last condition written to each Service (nil: removed).
	written map[string]writtenCondition
}

type writtenCondition struct {
	uid  types.UID
	cond *metav1.Condition
	at   time.Time
}

// newConditions writes conditions with client, reading Services from services.
func newConditions(client kubernetes.Interface, services corelisters.ServiceLister) *conditions {
	return &conditions{client: client, services: services, want: map[string]*metav1.Condition{}, written: map[string]writtenCondition{}}
}

// run writes queued conditions until ctx ends.
func (c *conditions) run(ctx context.Context) {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "labcloud-service-conditions"})
	c.mu.Lock()
	c.queue = q
	for k := range c.want { // updates that came before the queue
		q.Add(k)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for range conditionWorkers {
		wg.Go(func() {
			for c.next(ctx, q) {
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}

func (c *conditions) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	k, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(k)
	if err := c.write(ctx, k); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot write the Service's placement condition; retrying", "service", k)
		q.AddRateLimited(k)
		return true
	}
	q.Forget(k)
	return true
}

// update takes what every Service's condition should be after a pass:
// answers holds the Services with claimed VIPs; any other Service carrying
// the condition loses it (unless it is being deleted anyway).
func (c *conditions) update(answers map[string][]lb.Answer) {
	all, err := c.services.List(labels.Everything())
	if err != nil {
		return
	}
	cached := make(map[string]bool, len(all))
	for _, svc := range all {
		k := key(svc)
		cached[k] = true
		if a, ok := answers[k]; ok {
			want := lb.AnnouncedCondition(a)
			c.set(k, svc, &want)
			continue
		}
		if svc.DeletionTimestamp == nil {
			c.set(k, svc, nil) // removes ours, if it has it
		}
	}
	for k, a := range answers {
		if !cached[k] { // newer than the cache: the service controller's copy
			want := lb.AnnouncedCondition(a)
			c.set(k, nil, &want)
		}
	}
	c.mu.Lock()
	for k := range c.written {
		if _, answered := answers[k]; !answered && !cached[k] {
			delete(c.written, k) // the Service is gone
		}
	}
	c.mu.Unlock()
}

// set queues k's condition for writing if svc (the cached Service; nil if
// not cached) does not show it yet.
func (c *conditions) set(k string, svc *v1.Service, want *metav1.Condition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.needsWrite(k, svc, want) {
		delete(c.want, k)
		return
	}
	c.want[k] = want
	if c.queue != nil {
		c.queue.Add(k)
	}
}

// needsWrite reports whether the Service's condition differs from want:
// the condition as we last wrote it, if that was recent enough for the
// cache (svc; nil if not cached) to lag behind, else as cached. Callers
// hold mu.
func (c *conditions) needsWrite(k string, svc *v1.Service, want *metav1.Condition) bool {
	if w, ok := c.written[k]; ok && (svc == nil || w.uid == svc.UID) && time.Since(w.at) < CacheLag {
		return !sameCondition(w.cond, want)
	}
	if svc == nil {
		return true
	}
	return !sameCondition(meta.FindStatusCondition(svc.Status.Conditions, lb.ConditionAnnounced), want)
}

func sameCondition(a, b *metav1.Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return lb.SameAnnounced(*a, *b)
}

// write patches k's condition as wanted, if it still needs writing.
func (c *conditions) write(ctx context.Context, k string) error {
	ns, name := splitKey(k)
	svc, err := c.services.Services(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err != nil {
		svc = nil // not cached (yet): write anyway; the API says if it exists
	}
	c.mu.Lock()
	want, queued := c.want[k]
	if !queued || !c.needsWrite(k, svc, want) {
		if queued {
			delete(c.want, k)
		}
		c.mu.Unlock()
		return nil
	}
	var cond *metav1.Condition
	if want != nil {
		cc := *want
		cc.LastTransitionTime = c.since(k, svc, want)
		cond = &cc
	}
	c.mu.Unlock()

	patch, err := conditionPatch(cond)
	if err != nil {
		return err
	}
	out, err := c.client.CoreV1().Services(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	c.mu.Lock()
	defer c.mu.Unlock()
	if apierrors.IsNotFound(err) {
		// Gone (or not yet there): not asked again until the cache has
		// it, or the lag for our own writes has passed.
		delete(c.want, k)
		c.written[k] = writtenCondition{cond: cond, at: time.Now()}
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch status.conditions of Service %s: %w", k, err)
	}
	c.written[k] = writtenCondition{uid: out.UID, cond: cond, at: time.Now()}
	if now, ok := c.want[k]; ok && sameCondition(now, want) {
		delete(c.want, k) // unless a newer one came meanwhile (queued again)
	}
	klog.FromContext(ctx).V(2).Info("Wrote the Service's placement condition", "service", k, "condition", cond)
	return nil
}

// since is the lastTransitionTime for want: kept from our last write of the
// same answer to this Service (a rewrite does not move it), else now.
// Callers hold mu.
func (c *conditions) since(k string, svc *v1.Service, want *metav1.Condition) metav1.Time {
	if w, ok := c.written[k]; ok && svc != nil && w.uid == svc.UID && sameCondition(w.cond, want) {
		return w.cond.LastTransitionTime
	}
	return metav1.NewTime(time.Now())
}

// conditionPatch is a strategic merge patch of status.conditions that sets
// cond (merged by type: every other condition stays), or with cond nil
// deletes the Announced condition.
func conditionPatch(cond *metav1.Condition) ([]byte, error) {
	var entry any = cond
	if cond == nil {
		entry = map[string]string{"type": lb.ConditionAnnounced, "$patch": "delete"}
	}
	return json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{entry}}})
}
