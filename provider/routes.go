package provider

import (
	"context"
	"errors"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	cloudprovider "k8s.io/cloud-provider"
)

// routes is being written (issue: Routes); until it lands the provider
// refuses a routes.bridge setting rather than pretending.
type routes struct{ cloudprovider.Routes }

func newRoutes(RoutesConfig, []Hypervisor) (*routes, error) {
	return nil, errors.New("routes.bridge: pod-CIDR routes are not implemented in this build")
}

func (r *routes) start(context.Context, kubernetes.Interface, informers.SharedInformerFactory) error {
	return nil
}
