// Command lab-node is the node agent of a labcloud guest: it stands in for
// kubelet and kube-proxy (see package lab/nodeagent). It reads its identity
// and credentials from a JSON file (see package lab/nodeagent/nodeconfig)
// that the lab puts into the guest's initramfs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lab/nodeagent"
	"github.com/labcloud/labcloud/lab/nodeagent/nodeconfig"
)

func main() {
	klog.InitFlags(nil)
	configPath := flag.String("config", nodeconfig.DefaultPath, "node configuration file (JSON)")
	root := flag.String("host-root", "/", "root of the /sys, /proc and /etc to read the host description from")
	probeAddr := flag.String("probe-addr", fmt.Sprintf("0.0.0.0:%d", nodeagent.ProbePort), "address of the reachability probe (GET / and /reach?addr=IP); empty turns it off")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *configPath, *root, *probeAddr)
	stop()
	if err != nil {
		klog.ErrorS(err, "lab-node failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(ctx context.Context, configPath, root, probeAddr string) error {
	logger := klog.FromContext(ctx)
	cfg, err := nodeconfig.Load(configPath)
	if err != nil {
		return err
	}
	host := nodeagent.ReadHost(root)
	if host.SystemUUID == "" {
		logger.Info("Warning: no system UUID in /sys/class/dmi/id/product_uuid; the Node is registered without one")
	}
	logger.Info("Starting lab-node", "node", cfg.NodeName, "apiServer", cfg.APIServer,
		"systemUUID", host.SystemUUID, "kernel", host.KernelVersion, "config", configPath)

	client, err := kubernetes.NewForConfig(restConfig(cfg))
	if err != nil {
		return fmt.Errorf("create API client: %w", err)
	}
	ifs, err := nodeagent.NewNetlinkInterfaces()
	if err != nil {
		return err
	}
	defer ifs.Close()
	agent, err := nodeagent.New(nodeagent.Options{
		NodeName:   cfg.NodeName,
		Labels:     cfg.Labels,
		Client:     client,
		Interfaces: ifs,
		Host:       host,
		ProbeAddr:  probeAddr,
	})
	if err != nil {
		return err
	}
	return agent.Run(ctx)
}

// restConfig authenticates with the bearer token and trusts only the
// configured CA.
func restConfig(cfg nodeconfig.Config) *rest.Config {
	return &rest.Config{
		Host:            cfg.APIServer,
		BearerToken:     cfg.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(cfg.CACertPEM)},
		UserAgent:       "lab-node/" + cfg.NodeName,
		QPS:             20,
		Burst:           40,
	}
}
