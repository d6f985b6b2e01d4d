package controlplane

import (
	"slices"
	"strings"
	"testing"
)

// flagValue is the value after flag in args ("" when absent).
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// The CIDR flags of kube-apiserver and kube-controller-manager for each
// family the lab runs: dual-stack pairs in the primary family's order, and
// the per-family mask sizes that kube-controller-manager wants for them.
func TestCIDRFlagsPerFamily(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		clusterCIDR, serviceCIDR string
		mask                     map[string]string // flag → value; absent flags must not appear
	}{
		{name: "ipv4", clusterCIDR: "10.244.0.0/16", serviceCIDR: "10.96.0.0/16",
			mask: map[string]string{"--node-cidr-mask-size": "24"}},
		{name: "ipv6", clusterCIDR: "fd00:10:244::/56", serviceCIDR: "fd00:10:96::/112",
			mask: map[string]string{"--node-cidr-mask-size": "64"}},
		{name: "dual", clusterCIDR: "10.244.0.0/16,fd00:10:244::/56", serviceCIDR: "10.96.0.0/16,fd00:10:96::/112",
			mask: map[string]string{"--node-cidr-mask-size-ipv4": "24", "--node-cidr-mask-size-ipv6": "64"}},
		{name: "dual, IPv6 first", clusterCIDR: "fd00:10:244::/56,10.244.0.0/16", serviceCIDR: "fd00:10:96::/112,10.96.0.0/16",
			mask: map[string]string{"--node-cidr-mask-size-ipv4": "24", "--node-cidr-mask-size-ipv6": "64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &ControlPlane{opts: Options{Dir: "/cp", ClusterCIDR: tc.clusterCIDR, ServiceCIDR: tc.serviceCIDR,
				NodeCIDRMaskSize: 24, NodeCIDRMaskSizeIPv6: 64, ControllerManagerArgs: []string{"--v=2"}}, AdminKube: "/cp/admin"}
			api := cp.apiServerArgs("http://127.0.0.1:2379", 6443)
			if got := flagValue(api, "--service-cluster-ip-range"); got != tc.serviceCIDR {
				t.Errorf("kube-apiserver --service-cluster-ip-range %q, want %q", got, tc.serviceCIDR)
			}
			kcm, err := cp.controllerManagerArgs()
			if err != nil {
				t.Fatal(err)
			}
			for flag, want := range map[string]string{"--cluster-cidr": tc.clusterCIDR, "--service-cluster-ip-range": tc.serviceCIDR} {
				if got := flagValue(kcm, flag); got != want {
					t.Errorf("kube-controller-manager %s %q, want %q", flag, got, want)
				}
			}
			for _, flag := range []string{"--node-cidr-mask-size", "--node-cidr-mask-size-ipv4", "--node-cidr-mask-size-ipv6"} {
				if got, want := flagValue(kcm, flag), tc.mask[flag]; got != want {
					t.Errorf("kube-controller-manager %s %q, want %q (args %v)", flag, got, want, kcm)
				}
			}
			if !slices.Contains(kcm, "--allocate-node-cidrs") || kcm[len(kcm)-1] != "--v=2" {
				t.Errorf("kube-controller-manager args %v: want --allocate-node-cidrs and the extra flags last", kcm)
			}
		})
	}
}

func TestNodeCIDRMaskArgsBadCIDR(t *testing.T) {
	if _, err := NodeCIDRMaskArgs("10.244.0.0/16,fd00::/561", 24, 64); err == nil || !strings.Contains(err.Error(), "fd00::/561") {
		t.Errorf("err = %v, want one naming fd00::/561", err)
	}
}

// The kubernetes Service's address of each family is in the API server's
// certificate.
func TestFirstIP(t *testing.T) {
	for in, want := range map[string]string{"10.96.0.0/16": "10.96.0.1", "fd00:10:96::/112": "fd00:10:96::1", " 10.0.0.0/8": "10.0.0.1"} {
		if got := firstIP(in); got.String() != want {
			t.Errorf("firstIP(%q) = %v, want %s", in, got, want)
		}
	}
	if got := firstIP("nonsense"); got != nil {
		t.Errorf("firstIP(nonsense) = %v, want nil", got)
	}
}
