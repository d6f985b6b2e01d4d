package lbclass

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/cloud-provider/api"
	servicehelper "k8s.io/cloud-provider/service/helpers"
	"k8s.io/utils/ptr"
)

const class = "lb.labcloud.io/l2"

// balancer hands every Service one fixed address, or fails as told, and
// records the calls.
type balancer struct {
	mu      sync.Mutex
	ensured []string
	deleted []string
	fail    error
}

func (b *balancer) GetLoadBalancer(context.Context, string, *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	return nil, false, nil
}
func (b *balancer) GetLoadBalancerName(context.Context, string, *v1.Service) string { return "" }
func (b *balancer) EnsureLoadBalancer(_ context.Context, _ string, svc *v1.Service, _ []*v1.Node) (*v1.LoadBalancerStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ensured = append(b.ensured, svc.Namespace+"/"+svc.Name)
	if b.fail != nil {
		return nil, b.fail
	}
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "10.0.0.7"}}}, nil
}
func (b *balancer) UpdateLoadBalancer(context.Context, string, *v1.Service, []*v1.Node) error {
	return nil
}
func (b *balancer) EnsureLoadBalancerDeleted(_ context.Context, _ string, svc *v1.Service) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deleted = append(b.deleted, svc.Namespace+"/"+svc.Name)
	return nil
}

func (b *balancer) calls() (ensured, deleted []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.ensured...), append([]string(nil), b.deleted...)
}

func service(name string, cls *string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, LoadBalancerClass: cls, Ports: []v1.ServicePort{{Port: 80}}},
	}
}

type fixture struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	b      *balancer
	rec    *record.FakeRecorder
}

func start(t *testing.T, b *balancer, objs ...*v1.Service) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, client: fake.NewClientset(), b: b, rec: record.NewFakeRecorder(100)}
	for _, s := range objs {
		if _, err := f.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	factory := informers.NewSharedInformerFactory(f.client, 0)
	c, err := New(class, "test", b, f.client, factory.Core().V1().Services(), f.rec)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	go c.Run(ctx, 2)
	return f
}

func (f *fixture) get(name string) *v1.Service {
	f.t.Helper()
	s, err := f.client.CoreV1().Services("team").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
}

// warnings counts the Warning events of reason recorded so far.
func (f *fixture) warnings(reason string) int {
	n := 0
	for len(f.rec.Events) > 0 {
		if e := <-f.rec.Events; strings.HasPrefix(e, "Warning "+reason+" ") {
			n++
		}
	}
	return n
}

// TestServesItsClassOnly: a Service of the class gets the finalizer and
// its status; Services of another class or none are never touched.
func TestServesItsClassOnly(t *testing.T) {
	f := start(t, &balancer{}, service("mine", ptr.To(class)), service("other", ptr.To("example.com/other")), service("none", nil))
	f.waitFor("status of team/mine", func() bool {
		s := f.get("mine")
		return servicehelper.HasLBFinalizer(s) && len(s.Status.LoadBalancer.Ingress) == 1
	})
	time.Sleep(200 * time.Millisecond) // a wrong sync of the others would have run by now
	for _, name := range []string{"other", "none"} {
		if s := f.get(name); len(s.Finalizers) > 0 || len(s.Status.LoadBalancer.Ingress) > 0 {
			t.Errorf("team/%s was touched: finalizers %v, status %v", name, s.Finalizers, s.Status.LoadBalancer)
		}
	}
	ensured, _ := f.b.calls()
	if len(ensured) == 0 || slices.ContainsFunc(ensured, func(k string) bool { return k != "team/mine" }) {
		t.Errorf("EnsureLoadBalancer calls %v, want only team/mine", ensured)
	}
}

// TestReleasesOnDelete: once the API server marks the Service deleted
// (it waits for the finalizer), the controller releases its load balancer
// and removes the finalizer. A sync that still sees the Service in a stale
// cache may release it twice; release is idempotent, so only "at least
// once, and only this Service" is asked.
func TestReleasesOnDelete(t *testing.T) {
	f := start(t, &balancer{}, service("mine", ptr.To(class)))
	f.waitFor("finalizer", func() bool { return servicehelper.HasLBFinalizer(f.get("mine")) })
	s := f.get("mine")
	s.DeletionTimestamp = ptr.To(metav1.Now())
	if _, err := f.client.CoreV1().Services("team").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("released and finalizer removed", func() bool {
		_, deleted := f.b.calls()
		return len(deleted) > 0 && !servicehelper.HasLBFinalizer(f.get("mine"))
	})
	if _, deleted := f.b.calls(); slices.ContainsFunc(deleted, func(k string) bool { return k != "team/mine" }) {
		t.Errorf("EnsureLoadBalancerDeleted calls %v, want only team/mine", deleted)
	}
}

// TestOneWarningPerError: a failure that repeats on retries is one
// Warning, and a RetryError's delay is honoured instead of backing off.
func TestOneWarningPerError(t *testing.T) {
	b := &balancer{fail: api.NewRetryError("pool exhausted", 50*time.Millisecond)}
	f := start(t, b, service("mine", ptr.To(class)))
	f.waitFor("five tries within the RetryError's delays", func() bool { ensured, _ := b.calls(); return len(ensured) >= 5 })
	if n := f.warnings(ReasonFailed); n != 1 {
		t.Errorf("%d %s Warnings for one repeated error, want 1", n, ReasonFailed)
	}
}
