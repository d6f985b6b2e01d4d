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
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
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
	err := run(ctx, *kubeconfig, *node, *dir, *rtc)
	stop()
	if err != nil {
		klog.ErrorS(err, "lab-node failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

func run(ctx context.Context, kubeconfig, node, dir, rtc string) error {
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
	if rtc != "" {
		go followRTC(ctx, rtc, cfg.Host, client)
	}
	return nodecni.Run(ctx, client, node, dir)
}

// followRTC keeps the node's clock on the RTC's. After a step (a restored
// snapshot), once the API server answers, it aborts every connection to
// it: they were to a process that is gone, and watchers would not notice
// for up to 45 s.
func followRTC(ctx context.Context, rtc, apiServer string, client kubernetes.Interface) {
	log := klog.FromContext(ctx)
	u, err := url.Parse(apiServer)
	var api netip.AddrPort
	if err == nil {
		api, err = netip.ParseAddrPort(u.Host)
	}
	if err != nil {
		log.Error(err, "API server address", "server", apiServer)
	}
	stepped := func() {
		if !api.IsValid() {
			return
		}
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			_, err := client.Discovery().ServerVersion()
			return err == nil, nil
		})
		n, err := nodeclock.ResetConnections(api)
		log.Info("Aborted the connections to the API server of before the restore", "server", api, "aborted", n, "err", err)
	}
	if err := nodeclock.Follow(ctx, rtc, time.Second, stepped); err != nil {
		log.Error(err, "The clock does not follow the RTC: a restored snapshot keeps its old time")
	}
}
