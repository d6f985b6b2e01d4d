// Command lab-node runs on every labcloud node beside kubelet and
// kube-proxy: it writes the node's CNI configuration once
// kube-controller-manager has allocated the Node's pod CIDRs (package
// lab/nodecni), using kubelet's own credentials, and keeps the node's
// clock on the RTC's across a snapshot's restore (package lab/nodeclock).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lab/nodeclock"
	"github.com/labcloud/labcloud/lab/nodecni"
)

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "/etc/kubernetes/kubelet.conf", "kubeconfig with the node's credentials")
	node := flag.String("node-name", "", "name of this node's Node object (default: the hostname)")
	dir := flag.String("cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory")
	rtc := flag.String("rtc", "/dev/rtc0", "the RTC the clock follows (empty: none)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if *rtc != "" {
		go func() {
			if err := nodeclock.Follow(ctx, *rtc, time.Second); err != nil {
				klog.ErrorS(err, "The clock does not follow the RTC: a restored snapshot keeps its old time")
			}
		}()
	}
	err := run(ctx, *kubeconfig, *node, *dir)
	stop()
	if err != nil {
		klog.ErrorS(err, "lab-node failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

func run(ctx context.Context, kubeconfig, node, dir string) error {
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --node-name and no hostname: %w", err)
		}
		node = h
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "lab-node/" + node
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create API client: %w", err)
	}
	klog.FromContext(ctx).Info("Starting lab-node", "node", node, "cniConfDir", dir)
	return nodecni.Run(ctx, client, node, dir)
}
