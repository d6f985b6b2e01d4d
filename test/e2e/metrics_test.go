package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"
)

// metricsReader creates an identity allowed exactly `get` on the
// nonResourceURL /metrics (a ServiceAccount bound to a ClusterRole that
// says so), as a Prometheus scraping the CCM would have, and returns its
// token. The CCM authorizes it through the API server (delegated
// authorization, examples/rbac.yaml's system:auth-delegator).
func metricsReader(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	const name = "labcloud-e2e-metrics-reader"
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "default"}},
	}
	if _, err := env.admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.admin.CoreV1().ServiceAccounts("default").Delete(ctx, name, metav1.DeleteOptions{}) })
	if _, err := env.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.admin.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}) })
	if _, err := env.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.admin.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}) })
	tr, err := env.admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// sampleValue is the value of the sample of name whose labels include
// labels; ok is false if there is none.
func sampleValue(ms testutil.Metrics, name string, labels map[string]string) (float64, bool) {
	for _, s := range ms[name] {
		match := true
		for k, v := range labels {
			if string(s.Metric[testutil.LabelName(k)]) != v {
				match = false
			}
		}
		if match {
			return float64(s.Value), true
		}
	}
	return 0, false
}

// metricCheck is one expectation on a scrape.
type metricCheck struct {
	name   string
	labels map[string]string
	ok     func(float64) bool
	want   string // what ok checks, for the failure message
}

func atLeast(n float64) (func(float64) bool, string) {
	return func(v float64) bool { return v >= n }, fmt.Sprintf(">= %v", n)
}

func equal(n float64) (func(float64) bool, string) {
	return func(v float64) bool { return v == n }, fmt.Sprintf("== %v", n)
}

func check(name string, labels map[string]string, f func(float64) bool, want string) metricCheck {
	return metricCheck{name: name, labels: labels, ok: f, want: want}
}

// waitMetrics scrapes until every check holds and returns the last scrape.
func waitMetrics(t testing.TB, url, token string, timeout time.Duration, checks ...metricCheck) testutil.Metrics {
	t.Helper()
	var (
		ms     testutil.Metrics
		failed []string
	)
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		code, body, err := get(url, token)
		if err != nil || code != http.StatusOK {
			failed = []string{fmt.Sprintf("scrape: %d %v %.200s", code, err, body)}
			return false, nil
		}
		ms = testutil.NewMetrics()
		if err := testutil.ParseMetrics(body, &ms); err != nil {
			return false, err
		}
		failed = nil
		for _, c := range checks {
			v, found := sampleValue(ms, c.name, c.labels)
			if !found || !c.ok(v) {
				failed = append(failed, fmt.Sprintf("%s%v = %v (found %v), want %s", c.name, c.labels, v, found, c.want))
			}
		}
		return len(failed) == 0, nil
	})
	if err != nil {
		t.Fatalf("/metrics within %s: %s", timeout, strings.Join(failed, "; "))
	}
	return ms
}

// The CCM as shipped serves labcloud_* metrics on its secure port to an
// identity allowed to get /metrics, and refuses everyone else; the numbers
// follow what happens: a VIP allocated and answered, a failover from a
// domain destroyed, a libvirtd restart.
func TestMetricsThroughSecurePort(t *testing.T) {
	requireEnv(t)
	c := startCCM(t, lbCloudConfig("10.88.0.90-10.88.0.93"), lbControllers)
	servicesGoneAtEnd(t, "metrics-")
	macs := lbNodes(t, "e2e-metrics", 2)
	client := newLANClient(t, "10.88.0.11/24")
	token := metricsReader(t)
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", c.securePort)

	createLBService(t, "metrics-web", nil)
	vip, _ := waitVIP(t, "metrics-web", 30*time.Second)
	first := waitNodeARP(t, client, vip, macs, 10*time.Second)

	// Nobody else gets in.
	for _, tc := range []struct{ who, token string }{
		{"anonymous", ""},
		{"a made-up token", "not-a-token"},
		{"the CCM's own service account (no /metrics permission)", serviceAccountToken(t)},
	} {
		code, body, err := get(url, tc.token)
		if err != nil || (code != http.StatusUnauthorized && code != http.StatusForbidden) {
			t.Errorf("/metrics as %s: %d %v, want 401 or 403 (%.200s)", tc.who, code, err, body)
		}
		if strings.Contains(body, "labcloud_") {
			t.Errorf("/metrics as %s served labcloud metrics", tc.who)
		}
	}

	out, err := exec.Command(env.ccmBin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", env.ccmBin, err, out)
	}
	fields := strings.Fields(string(out)) // "libvirt-cloud-controller-manager VERSION (...)"
	if len(fields) < 2 || fields[1] == "unknown" {
		t.Fatalf("--version says %q: the e2e binary carries no version", out)
	}
	version := fields[1]

	pool := map[string]string{"pool": "e2e"}
	zone := map[string]string{"zone": "e2e-zone"}
	one, is1 := equal(1)
	four, is4 := equal(4)
	some, isSome := atLeast(1)
	two, isTwo := atLeast(2)
	ms := waitMetrics(t, url, token, 30*time.Second,
		check("labcloud_build_info", map[string]string{"version": version}, one, is1),
		check("labcloud_lb_pool_addresses", pool, four, is4),
		check("labcloud_lb_pool_addresses_in_use", pool, one, is1),
		check("labcloud_lb_allocations_total", pool, some, isSome),
		check("labcloud_lb_arp_replies_total", nil, some, isSome),
		check("labcloud_lb_placement_pass_seconds_count", nil, some, isSome),
		check("labcloud_libvirt_cached_domains", zone, two, isTwo),
		check("labcloud_libvirt_call_duration_seconds_count", map[string]string{"call": "GetAllDomainStats"}, some, isSome),
	)
	if v, ok := sampleValue(ms, "labcloud_lb_releases_total", pool); ok && v != 0 {
		t.Errorf("labcloud_lb_releases_total = %v before anything was released", v)
	}
	for name := range ms {
		if strings.HasPrefix(name, "labcloud_lb_vip_moves_total") {
			t.Errorf("a VIP move counted before any: %v", ms[name])
		}
	}

	// Failover: the answering domain is destroyed.
	if err := domain(t, first).Destroy(); err != nil {
		t.Fatal(err)
	}
	other := otherNode(macs, first)
	client.waitARP(t, vip, macs[other], 15*time.Second)
	ms = waitMetrics(t, url, token, 15*time.Second,
		check("labcloud_lb_vip_moves_total", map[string]string{"reason": "domain_down"}, one, is1),
		check("labcloud_lb_failover_seconds_count", nil, one, is1),
	)
	sum, _ := sampleValue(ms, "labcloud_lb_failover_seconds_sum", nil)
	if sum <= 0 || sum > 5 {
		t.Errorf("failover took %vs from the first sign (the tap, or the libvirt event) to the first gratuitous ARP, want (0, 5]", sum)
	}
	t.Logf("failover: the tap leaving the bridge -> first gratuitous ARP %.2f ms", sum*1000)

	// libvirtd restarts: the CCM reconnects, and counts it.
	env.daemon.StopLibvirtd()
	restarted := false
	defer func() {
		if !restarted {
			_ = env.daemon.StartLibvirtd(context.Background())
		}
	}()
	time.Sleep(time.Second)
	if err := env.daemon.StartLibvirtd(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	if env.virt, err = reconnect(); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, url, token, 60*time.Second, check("labcloud_libvirt_reconnects_total", zone, some, isSome))
}
