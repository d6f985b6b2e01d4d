// Command libvirt-cloud-controller-manager is the Kubernetes cloud controller
// manager for libvirt/KVM hosts. The upstream app owns informers, workqueues,
// leader election, secure serving and metrics; this file only supplies the
// provider and defaults that suit a lab.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	nodecontroller "k8s.io/cloud-provider/controllers/node"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics on /metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider"
	"github.com/labcloud/labcloud/quietlog"
	"github.com/labcloud/labcloud/version"
)

func main() {
	// A heap that grows to 1.15x what is live instead of 2x lowers the
	// peak for CPU within noise, and scales with the cluster, unlike a
	// fixed GOMEMLIMIT (docs/performance.md, Memory). GOGC in the
	// environment wins.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(15)
	}
	// labcloud_* on /metrics; before the provider starts counting.
	metrics.Register()
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	setDefaults(opts)

	var cfg provider.Config
	var splitStream bool
	initCloud := func(c *config.CompletedConfig) cloudprovider.Interface {
		// Logging is set up by now. Lines that only say nothing changed
		// need -v=2 (quietlog); split streams buffer info lines behind a
		// flush that cannot be carried over to a wrapped logger, so they
		// keep upstream's lines.
		if !splitStream && !quietlog.Install() {
			klog.V(2).Info("Logging through klog without a logger (contextual logging disabled): per-pass lines stay at level 0")
		}
		// Upstream's "Version:" line gives the Kubernetes libraries'.
		klog.InfoS("Starting libvirt-cloud-controller-manager", "version", version.Get())
		// The factory every controller and the provider share, rebuilt
		// with a transform before anything asks it for an informer (the
		// upstream app creates it in Config and hands it out only after
		// this call): cached objects lose what the CCM never reads.
		c.SharedInformers = informers.NewSharedInformerFactoryWithOptions(c.VersionedClient, app.ResyncPeriod(c)(),
			informers.WithTransform(provider.TrimForCache))
		// The route controller parses the same flag; routes go only inside it.
		clusterCIDRs, err := provider.ParseClusterCIDRs(c.ComponentConfig.KubeCloudShared.ClusterCIDR)
		if err != nil {
			klog.Fatalf("libvirt cloud provider: %v", err)
		}
		cloud, err := provider.Open(context.Background(), cfg, provider.Flags{ClusterCIDRs: clusterCIDRs, Client: c.VersionedClient})
		if err != nil {
			klog.Fatalf("libvirt cloud provider: %v", err)
		}
		go feedWatchdog(context.Background(), cloud)
		return cloud
	}
	cmd := app.NewCloudControllerManagerCommand(opts, initCloud, controllers(),
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	cmd.Use = "libvirt-cloud-controller-manager"
	cmd.AddCommand(withdrawCommand())

	// Check the provider name and the cloud config before anything talks to
	// the cluster, so a bad file fails fast with a message naming the field.
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		// --version names this binary (upstream's prints "Kubernetes");
		// --version=raw stays upstream's.
		if f := c.Flags().Lookup("version"); f != nil && f.Value.String() == "true" {
			fmt.Fprintf(c.OutOrStdout(), "libvirt-cloud-controller-manager %s (k8s.io/cloud-provider %s, %s)\n",
				version.Get(), moduleVersion("k8s.io/cloud-provider"), runtime.Version())
			return nil
		}
		cp := opts.KubeCloudShared.CloudProvider
		if cp.Name != provider.ProviderName {
			return fmt.Errorf("--cloud-provider=%q: this binary only provides %q", cp.Name, provider.ProviderName)
		}
		if cfg, err = provider.LoadConfigFile(cp.CloudConfigFile); err != nil {
			return err
		}
		if err := cfg.CheckHypervisorFiles(); err != nil {
			return err
		}
		for _, name := range []string{"log-text-split-stream", "log-json-split-stream"} {
			if f := c.Flags().Lookup(name); f != nil && f.Value.String() == "true" {
				splitStream = true
			}
		}
		return run(c, args)
	}
	os.Exit(cli.Run(cmd))
}

// setDefaults tunes the upstream defaults (client QPS 20/burst 30, one node
// worker, one service worker) for a host where the hypervisor answers from
// memory: initializing 100 Nodes takes seconds with them and well under one
// with these. Flags still override every value.
func setDefaults(o *options.CloudControllerManagerOptions) {
	o.KubeCloudShared.CloudProvider.Name = provider.ProviderName
	o.Generic.ClientConnection.QPS = 500
	o.Generic.ClientConnection.Burst = 1000
	o.NodeController.ConcurrentNodeSyncs = 10
	// A new VIP's sync waits mostly for the bridge's answer to its
	// conflict probe, so more workers overlap the probes until the API
	// server is the bound (docs/performance.md, Services and placement).
	o.ServiceController.ConcurrentServiceSyncs = 50
	// A route reconcile costs one netlink dump and a walk over the Node
	// cache, so a new Node's route need not wait up to upstream's 10 s.
	// (The watch-based gate is no faster and never repairs a flushed table.)
	o.KubeCloudShared.RouteReconciliationPeriod.Duration = 2 * time.Second
	// The cloud-node controller updates a new Node from its informer's copy;
	// kube-controller-manager writes the same Node at the same moment (pod
	// CIDR, not-ready taint), so the first update usually conflicts. The
	// upstream retry's wait is most of a Node's initialization time; the
	// informer catches up much sooner.
	nodecontroller.UpdateNodeSpecBackoff = wait.Backoff{Steps: 100, Duration: 2 * time.Millisecond, Jitter: 1.0}
}

// moduleVersion is the version of a dependency compiled in, from the
// binary's build information.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "unknown"
}
