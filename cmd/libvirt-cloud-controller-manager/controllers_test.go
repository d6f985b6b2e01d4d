package main

import (
	"testing"

	"k8s.io/cloud-provider/app"
)

// TestControllers: the upstream service controller is still there (wrapped,
// with its own client name), the class controller shares its client name
// and so its RBAC, and the data-path check is registered.
func TestControllers(t *testing.T) {
	c := controllers()
	svc, ok := c[upstreamServiceController]
	if !ok || svc.Constructor == nil || svc.InitContext != app.DefaultInitFuncConstructors[upstreamServiceController].InitContext {
		t.Fatalf("upstream service controller: %+v", svc)
	}
	class, ok := c[classController]
	if !ok || class.Constructor == nil || class.InitContext.ClientName != svc.InitContext.ClientName || class.InitContext.ClientName == "" {
		t.Errorf("class controller: %+v, want the service controller's client name %q", class, svc.InitContext.ClientName)
	}
	if d, ok := c[dataPathController]; !ok || d.Constructor == nil {
		t.Errorf("data-path check missing")
	}
	if len(c) != len(app.DefaultInitFuncConstructors)+2 {
		t.Errorf("%d controllers, want upstream's %d and ours", len(c), len(app.DefaultInitFuncConstructors))
	}
}
