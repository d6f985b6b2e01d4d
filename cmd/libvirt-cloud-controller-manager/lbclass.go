package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	genericcontrollermanager "k8s.io/controller-manager/app"
	"k8s.io/controller-manager/controller"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lbclass"
)

// classController serves the Services of loadBalancer.class beside the
// upstream service controller; --controllers names it too.
const classController = "service-lb-class-controller"

// classChooser is what the controllers ask the provider about classes;
// *provider.Cloud has it.
type classChooser interface {
	LoadBalancerClass() (class string, serveClassless bool)
}

func startClassController(initContext app.ControllerInitContext, completed *config.CompletedConfig, cloud cloudprovider.Interface) app.InitFunc {
	return func(ctx context.Context, _ genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
		c, ok := cloud.(classChooser)
		if !ok {
			return nil, false, nil
		}
		class, _ := c.LoadBalancerClass()
		balancer, ok := cloud.LoadBalancer()
		if class == "" || !ok {
			return nil, false, nil
		}
		client := completed.ClientBuilder.ClientOrDie(initContext.ClientName)
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartStructuredLogging(3)
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
		recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: classController})
		ctl, err := lbclass.New(class, completed.ComponentConfig.KubeCloudShared.ClusterName, balancer, client,
			completed.SharedInformers.Core().V1().Services(), recorder)
		if err != nil {
			return nil, false, err
		}
		go ctl.Run(ctx, int(completed.ComponentConfig.ServiceController.ConcurrentServiceSyncs))
		return nil, true, nil
	}
}

// classlessOnlyIfServed wraps the upstream service controller, which serves
// Services without a class: with loadBalancer.serveClassless false it does
// not start, so those Services are not touched (no finalizer, no status).
func classlessOnlyIfServed(upstream app.InitFuncConstructor) app.InitFuncConstructor {
	return func(initContext app.ControllerInitContext, completed *config.CompletedConfig, cloud cloudprovider.Interface) app.InitFunc {
		start := upstream(initContext, completed, cloud)
		return func(ctx context.Context, cc genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
			if c, ok := cloud.(classChooser); ok {
				if _, classless := c.LoadBalancerClass(); !classless {
					klog.FromContext(ctx).Info("Services without a loadBalancerClass are not served (loadBalancer.serveClassless: false)")
					return nil, false, nil
				}
			}
			return start(ctx, cc)
		}
	}
}
