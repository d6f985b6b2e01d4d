// Package nodecni writes a lab node's CNI configuration once
// kube-controller-manager has given the Node its pod CIDRs: the bridge
// plugin on cni0 with host-local addresses from spec.podCIDRs, the node as
// the pods' gateway, and no masquerading, so pod traffic leaves the node with
// the pod's own address and reaches other nodes through the
// cloud-controller-manager's routes on the host bridge. Until the file
// exists kubelet reports the network not ready, as on any kubeadm node
// before its CNI is installed.
package nodecni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// FileName is the configuration's name in the CNI configuration directory.
const FileName = "10-labcloud.conflist"

// BridgeName is the node's pod bridge.
const BridgeName = "cni0"

// Conflist returns the CNI configuration list for the given pod CIDRs
// (one per family, as in Node.spec.podCIDRs).
func Conflist(podCIDRs []string) ([]byte, error) {
	if len(podCIDRs) == 0 {
		return nil, errors.New("no pod CIDR")
	}
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("pod CIDR %q: %w", c, err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("pod CIDR %q: not a network address", c)
		}
		ranges = append(ranges, []map[string]string{{"subnet": p.String()}})
		dst := "0.0.0.0/0"
		if p.Addr().Is6() {
			dst = "::/0"
		}
		routes = append(routes, map[string]string{"dst": dst})
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "labcloud",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      BridgeName,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam":        map[string]any{"type": "host-local", "ranges": ranges, "routes": routes},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// Write writes the configuration for podCIDRs into dir unless the file
// there already says the same; it reports whether it wrote.
func Write(dir string, podCIDRs []string) (bool, error) {
	want, err := Conflist(podCIDRs)
	if err != nil {
		return false, err
	}
	p := filepath.Join(dir, FileName)
	if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	// Atomic: the runtime watches the directory and must never read half a file.
	tmp := filepath.Join(dir, "."+FileName+".tmp")
	if err := os.WriteFile(tmp, want, 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, p)
}

// Run watches the Node named node and keeps dir's configuration in step
// with its pod CIDRs until ctx ends.
func Run(ctx context.Context, client kubernetes.Interface, node, dir string) error {
	logger := klog.FromContext(ctx).WithValues("node", node)
	var last []string
	sync := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok {
			return
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		if len(cidrs) == 0 || slices.Equal(cidrs, last) {
			return
		}
		wrote, err := Write(dir, cidrs)
		if err != nil {
			logger.Error(err, "Writing the CNI configuration failed", "podCIDRs", cidrs)
			return
		}
		last = cidrs
		if wrote {
			logger.Info("Wrote the CNI configuration", "podCIDRs", cidrs, "file", filepath.Join(dir, FileName))
		}
	}
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", node))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1.Node{},
		ResyncPeriod:  time.Minute,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    sync,
			UpdateFunc: func(_, n any) { sync(n) },
		},
	})
	ctrl.RunWithContext(ctx)
	return nil
}
