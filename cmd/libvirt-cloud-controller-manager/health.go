package main

import (
	"context"
	"net/http"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	genericcontrollermanager "k8s.io/controller-manager/app"
	"k8s.io/controller-manager/controller"
	controllerhealthz "k8s.io/controller-manager/pkg/healthz"
	"k8s.io/klog/v2"
)

// dataPathController is the name under which /healthz checks the data
// path (healthz/libvirt-data-path); --controllers names it too.
const dataPathController = "libvirt-data-path"

// dataPathChecker is what the health check asks; *provider.Cloud has it.
type dataPathChecker interface {
	CheckDataPath() error
}

// controllers are upstream's controllers (the service controller only
// while Services without a class are served), the controller of
// loadBalancer.class, and the data path's health check, which the
// upstream app serves on /healthz like a controller's.
func controllers() map[string]app.ControllerInitFuncConstructor {
	out := make(map[string]app.ControllerInitFuncConstructor, len(app.DefaultInitFuncConstructors)+2)
	for name, c := range app.DefaultInitFuncConstructors {
		out[name] = c
	}
	svc := out[upstreamServiceController]
	svc.Constructor = classlessOnlyIfServed(svc.Constructor)
	out[upstreamServiceController] = svc
	out[classController] = app.ControllerInitFuncConstructor{
		InitContext: app.ControllerInitContext{ClientName: svc.InitContext.ClientName},
		Constructor: startClassController,
	}
	out[dataPathController] = app.ControllerInitFuncConstructor{Constructor: startDataPathCheck}
	return out
}

// upstreamServiceController is the upstream service controller's name.
const upstreamServiceController = names.ServiceLBController

func startDataPathCheck(_ app.ControllerInitContext, _ *config.CompletedConfig, cloud cloudprovider.Interface) app.InitFunc {
	return func(context.Context, genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
		c, ok := cloud.(dataPathChecker)
		if !ok {
			return nil, false, nil
		}
		return dataPathCheck{c}, true, nil
	}
}

type dataPathCheck struct{ c dataPathChecker }

var _ controller.HealthCheckable = dataPathCheck{}

func (dataPathCheck) Name() string { return dataPathController }

func (d dataPathCheck) HealthChecker() controllerhealthz.UnnamedHealthChecker { return d }

// Check implements the health check.
func (d dataPathCheck) Check(*http.Request) error { return d.c.CheckDataPath() }

// feedWatchdog tells systemd's watchdog (WatchdogSec= in the unit) that
// the CCM is alive, twice per period and only while its data path is
// healthy: a CCM that cannot answer VIPs or write routes is restarted
// rather than left running and useless. Without a watchdog it returns.
func feedWatchdog(ctx context.Context, c dataPathChecker) {
	period, err := daemon.SdWatchdogEnabled(false)
	if err != nil || period <= 0 {
		return
	}
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period / 2)
	defer t.Stop()
	for {
		if err := c.CheckDataPath(); err != nil {
			logger.Error(err, "Data path unhealthy: not feeding systemd's watchdog")
		} else if _, err := daemon.SdNotify(false, daemon.SdNotifyWatchdog); err != nil {
			logger.Error(err, "Notifying systemd's watchdog")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
