package provider

import (
	"context"
	"errors"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	cloudprovider "k8s.io/cloud-provider"
)

// loadBalancer is being written; until it lands the provider refuses a
// loadBalancer.bridge setting rather than pretending.
type loadBalancer struct{ cloudprovider.LoadBalancer }

func newLoadBalancer(context.Context, LoadBalancerConfig, []Hypervisor) (*loadBalancer, error) {
	return nil, errors.New("loadBalancer.bridge: load balancers are not implemented in this build")
}

func (l *loadBalancer) start(context.Context, kubernetes.Interface, informers.SharedInformerFactory) error {
	return nil
}
