package provider

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"
)

// ReasonNotConfigured is the Warning on a LoadBalancer Service while the
// cloud config has no load balancer (no loadBalancer.bridge and pools).
const ReasonNotConfigured = "LoadBalancerNotConfigured"

// errLoadBalancerOff is what every LoadBalancer Service gets while the cloud
// config has no load balancer: it names the fields to set.
var errLoadBalancerOff = errors.New("load balancers are off: set loadBalancer.bridge and loadBalancer.pools in the CCM's cloud config (--cloud-config)")

// loadBalancerOff serves LoadBalancer Services while none is configured (the
// installed config): it allocates and announces nothing, and tells each
// Service which fields to set instead of leaving it pending in silence.
// Deleting a Service always succeeds, so its finalizer never sticks.
type loadBalancerOff struct {
	recorder record.EventRecorder
}

var _ cloudprovider.LoadBalancer = (*loadBalancerOff)(nil)

func (o *loadBalancerOff) start(ctx context.Context, _ kubernetes.Interface, _ informers.SharedInformerFactory, recorder record.EventRecorder) error {
	o.recorder = recorder
	klog.FromContext(ctx).Info("Load balancers are off: LoadBalancer Services get a Warning event and no address until loadBalancer.bridge and loadBalancer.pools are set in the cloud config")
	return nil
}

// GetLoadBalancer: no Service has a load balancer.
func (o *loadBalancerOff) GetLoadBalancer(context.Context, string, *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	return nil, false, nil
}

// GetLoadBalancerName is the upstream default name.
func (o *loadBalancerOff) GetLoadBalancerName(_ context.Context, _ string, svc *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(svc)
}

// EnsureLoadBalancer warns on the Service and fails.
func (o *loadBalancerOff) EnsureLoadBalancer(_ context.Context, _ string, svc *v1.Service, _ []*v1.Node) (*v1.LoadBalancerStatus, error) {
	return nil, o.refuse(svc)
}

// UpdateLoadBalancer warns on the Service and fails.
func (o *loadBalancerOff) UpdateLoadBalancer(_ context.Context, _ string, svc *v1.Service, _ []*v1.Node) error {
	return o.refuse(svc)
}

// EnsureLoadBalancerDeleted has nothing to release.
func (o *loadBalancerOff) EnsureLoadBalancerDeleted(context.Context, string, *v1.Service) error {
	return nil
}

func (o *loadBalancerOff) refuse(svc *v1.Service) error {
	if o.recorder != nil {
		o.recorder.Event(svc, v1.EventTypeWarning, ReasonNotConfigured, errLoadBalancerOff.Error())
	}
	return fmt.Errorf("service %s/%s: %w", svc.Namespace, svc.Name, errLoadBalancerOff)
}
