package up

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// The lab's cluster DNS is CoreDNS (hack/dnstools) running beside the
// control plane in the lab's namespace, on the bridge address. Pods reach
// it as kubeadm clusters do: the kubelets' clusterDNS is the kube-dns
// Service's cluster IPs, and that Service's endpoints are the bridge's
// addresses (one of each of the cluster's families), so kube-proxy carries
// the queries there.
const dnsUser = "labcloud:coredns"

// DNS runs CoreDNS with its own token and read-only RBAC, publishes it as
// kube-dns, and waits until it answers for the API server's Service.
type DNS struct {
	Tools       *Tools       // coredns
	Credentials *Credentials // CoreDNS's token, in the API server's token file
	Cluster     *Cluster
}

// corefile serves the cluster's Service names (and reverse lookups of
// their addresses) from the API server, on the bridge's addresses only.
// Names in the host's /etc/hosts come next (CoreDNS shares the host's
// filesystem), then every other name is forwarded to the host's
// resolvers (upstreams, reached through the uplink); with none, other
// names get no answer.
func corefile(kubeconfig string, a lab.Addresses, upstreams []string) string {
	forward := ""
	if len(upstreams) > 0 {
		forward = "\n    forward . " + strings.Join(upstreams, " ")
	}
	return fmt.Sprintf(`.:53 {
    bind %s
    errors
    hosts /etc/hosts {
        fallthrough
    }
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }%s
    cache 30
    loadbalance
}
`, strings.Join(a.Gateways(), " "), lab.ClusterDomain, kubeconfig, forward)
}

// The host's resolver configurations: resolv.conf and, where it names
// only systemd-resolved's stub, the upstreams resolved uses.
const (
	resolvConf        = "/etc/resolv.conf"
	resolvedResolvers = "/run/systemd/resolve/resolv.conf"
)

// hostResolvers are the nameservers the lab's DNS forwards to: those of
// resolvConf that the lab can reach (IPv4, not loopback: the lab reaches
// out by IPv4 NAT only), else those of resolved, the contents of
// resolvedResolvers (nil when missing).
func hostResolvers(resolvConf, resolved []byte) []string {
	if out := nameservers(resolvConf); len(out) > 0 {
		return out
	}
	return nameservers(resolved)
}

func nameservers(conf []byte) []string {
	var out []string
	for _, line := range strings.Split(string(conf), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() && !a.IsUnspecified() {
			out = append(out, a.String())
		}
	}
	return out
}

// dnsRBAC lets the DNS user read what the kubernetes plugin watches, and
// nothing else.
func dnsRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: dnsUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: dnsUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: dnsUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: dnsUser}},
	}
	return role, binding
}

// kubeDNS is kubeadm's kube-dns Service, without a selector: its endpoints
// are the lab's CoreDNS on the bridge's addresses (kubeDNSEndpoints), with
// a cluster IP of each of the cluster's families, primary first.
func kubeDNS(a lab.Addresses) *v1.Service {
	ports := []v1.ServicePort{
		{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
		{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec:       v1.ServiceSpec{ClusterIP: a.ClusterDNS()[0], ClusterIPs: a.ClusterDNS(), Ports: ports},
	}
	if len(a.ClusterDNS()) > 1 {
		svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	}
	return svc
}

// kubeDNSEndpoints are kube-dns's EndpointSlices, one per family: the
// bridge's address of that family.
func kubeDNSEndpoints(a lab.Addresses) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, gw := range a.Gateways() {
		name, typ := "kube-dns-lab", discoveryv1.AddressTypeIPv4
		if netip.MustParseAddr(gw).Is6() {
			name, typ = "kube-dns-lab-ipv6", discoveryv1.AddressTypeIPv6
		}
		out = append(out, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{
				discoveryv1.LabelServiceName: "kube-dns",
				discoveryv1.LabelManagedBy:   "labcloud",
			}},
			AddressType: typ,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{gw}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](53)},
				{Name: ptr.To("dns-tcp"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](53)},
			},
		})
	}
	return out
}

func (a *DNS) Execute(ctx context.Context, env *Env) error {
	st, cp, client := env.State, a.Cluster.CP, a.Cluster.Client
	bin := filepath.Join(a.Tools.Dir, "coredns")
	if !isFile(bin) {
		return fmt.Errorf("%s missing: run make tools (hack/build-tools.sh)", bin)
	}
	role, binding := dnsRBAC()
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster role %s: %w", role.Name, err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster role binding %s: %w", binding.Name, err)
	}
	kc := filepath.Join(st.Dir, "coredns.kubeconfig")
	if err := cp.WriteKubeconfig(kc, dnsUser, a.Credentials.DNSToken); err != nil {
		return err
	}
	conf := filepath.Join(st.Dir, "Corefile")
	fam := env.addresses()
	rc, _ := os.ReadFile(resolvConf)
	resolved, _ := os.ReadFile(resolvedResolvers)
	upstreams := hostResolvers(rc, resolved)
	if st.Light { // no uplink: nothing outside to forward to
		upstreams = nil
	} else if len(upstreams) == 0 {
		env.say("the host has no IPv4 resolver the lab can reach (%s, %s): cluster DNS answers only the cluster's names and %s's", resolvConf, resolvedResolvers, "/etc/hosts")
	} else {
		env.say("cluster DNS forwards other names to the host's resolvers %s", strings.Join(upstreams, ", "))
	}
	if err := os.WriteFile(conf, []byte(corefile(kc, fam, upstreams)), 0o644); err != nil {
		return err
	}
	p, err := controlplane.StartDaemon(lab.DNSLog(st.Dir), bin, "-conf", conf)
	if err != nil {
		return err
	}
	st.Pids[lab.DNSPid] = p.Pid()
	dns := kubeDNS(fam)
	// A restored lab has them already (creating the Service again fails
	// on its cluster IP, before its name is looked at).
	if _, err := client.CoreV1().Services("kube-system").Get(ctx, dns.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = client.CoreV1().Services("kube-system").Create(ctx, dns, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("service kube-system/kube-dns: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("service kube-system/kube-dns: %w", err)
	}
	for _, s := range kubeDNSEndpoints(fam) {
		if _, err := client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("endpoint slice %s of kube-system/kube-dns: %w", s.Name, err)
		}
	}
	api, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return err
	}
	// The kubernetes Service has the API server's family only; every
	// bridge address must answer for it.
	name, want := "kubernetes.default.svc."+lab.ClusterDomain, api.Spec.ClusterIP
	network := "ip4"
	if netip.MustParseAddr(want).Is6() {
		network = "ip6"
	}
	for _, gw := range fam.Gateways() {
		var last error
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if p.Exited() {
				return false, fmt.Errorf("coredns exited at start:\n%s", p.Tail(20))
			}
			addrs, err := resolveAt(ctx, gw, network, name)
			if err == nil && len(addrs) == 1 && addrs[0] == want {
				return true, nil
			}
			last = fmt.Errorf("%s at %s: %v %v, want %s", name, gw, addrs, err, want)
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("cluster DNS not answering: %w (last: %v; log %s)", err, last, lab.DNSLog(st.Dir))
		}
		env.say("%s -> %s from CoreDNS at %s", name, want, gw)
	}
	env.say("Service kube-system/kube-dns %s", strings.Join(dns.Spec.ClusterIPs, ","))
	return nil
}

// resolveAt looks name up (network "ip4": A, "ip6": AAAA records) at the
// DNS server on server:53.
func resolveAt(ctx context.Context, server, network, name string) ([]string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(server, "53"))
	}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := r.LookupIP(ctx, network, name)
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out, err
}
