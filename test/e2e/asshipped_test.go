package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
)

// The CCM as examples/ ships it (the unit's flags, the RBAC) against the
// real API server: it serves /healthz on its secure port, authenticates and
// authorizes other paths through the API server, becomes leader and does
// its work.
func TestCCMAsShipped(t *testing.T) {
	requireEnv(t)
	c := startCCM(t, libvirtCloudConfig())

	args, err := cmdline(c.proc.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range args {
		for _, bad := range []string{"--leader-elect=false", "--secure-port=0", "--authentication-skip-lookup"} {
			if a == bad {
				t.Errorf("the CCM runs with %s: %q", bad, args)
			}
		}
	}

	base := fmt.Sprintf("https://127.0.0.1:%d", c.securePort)
	start := time.Now()
	var last string
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		code, body, err := get(base+"/healthz", "")
		last = fmt.Sprintf("%d %q %v", code, body, err)
		return err == nil && code == http.StatusOK && body == "ok", nil
	})
	if err != nil {
		t.Fatalf("no healthy /healthz on the secure port within 60s (last: %s); log:\n%s", last, c.proc.Tail(30))
	}
	t.Logf("/healthz ok on :%d %s after start", c.securePort, time.Since(start).Round(time.Millisecond))

	// Leader: the Lease names a holder and the CCM says it acquired it.
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := env.admin.CoordinationV1().Leases("kube-system").Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return false, nil
		}
		return strings.Contains(c.proc.Tail(500), "Successfully acquired lease"), nil
	})
	if err != nil {
		t.Fatalf("the CCM did not become leader; log:\n%s", c.proc.Tail(30))
	}

	// Delegated authentication and authorization: /metrics is refused to
	// an anonymous caller and to the CCM's own service account (authorized
	// by the API server's SubjectAccessReview: 403), served to an admin.
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"anonymous", "", http.StatusForbidden},
		{"the CCM's service account", serviceAccountToken(t), http.StatusForbidden},
		{"a cluster admin", adminToken(t), http.StatusOK},
	} {
		code, body, err := get(base+"/metrics", tc.token)
		if err != nil || code != tc.want {
			t.Errorf("/metrics as %s: %d %v, want %d (%.200s)", tc.who, code, err, tc.want, body)
		}
	}

	// And it works: a Node of a domain is initialized.
	uuid, _ := defineDomain(t, "e2e-shipped", true)
	createNode(t, "e2e-shipped", v1.ConditionTrue)
	n := waitNode(t, "e2e-shipped", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && !hasTaint(n, uninitializedTaint) })
	if n.Spec.ProviderID != "libvirt://"+uuid {
		t.Errorf("providerID = %q", n.Spec.ProviderID)
	}
	if strings.Contains(c.proc.Tail(500), "forbidden") {
		t.Errorf("the shipped RBAC forbids something the CCM does; log:\n%s", grepLines(c.proc.Tail(500), "forbidden"))
	}
}

// A second replica as shipped waits as a standby: healthy, not leader.
func TestCCMStandbyReplica(t *testing.T) {
	requireEnv(t)
	first := startCCM(t, libvirtCloudConfig())
	waitLog(t, first, "Successfully acquired lease", 60*time.Second)
	second := startCCM(t, libvirtCloudConfig())
	if second.securePort == first.securePort {
		t.Fatalf("both replicas on port %d", first.securePort)
	}
	waitLog(t, second, "Attempting to acquire leader lease", 60*time.Second)
	time.Sleep(3 * time.Second) // two retry periods
	if strings.Contains(second.proc.Tail(500), "Successfully acquired lease") {
		t.Fatalf("the standby became leader while the leader runs; log:\n%s", second.proc.Tail(20))
	}
	// The leader dies without releasing its lease: the standby takes over
	// once the lease expires (15 s as shipped).
	first.proc.Kill()
	start := time.Now()
	waitLog(t, second, "Successfully acquired lease", 40*time.Second)
	t.Logf("standby became leader %s after the leader was killed", time.Since(start).Round(100*time.Millisecond))
}

func waitLog(t testing.TB, c *ccm, what string, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return strings.Contains(c.proc.Tail(2000), what), nil
	})
	if err != nil {
		t.Fatalf("no %q in the CCM log within %s:\n%s", what, timeout, c.proc.Tail(30))
	}
}

func grepLines(s, what string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// adminToken is the bearer token of the control plane's cluster admin.
func adminToken(tb testing.TB) string {
	tb.Helper()
	admin, err := clientcmd.BuildConfigFromFlags("", env.cp.AdminKube)
	if err != nil {
		tb.Fatal(err)
	}
	return admin.BearerToken
}

// get fetches url over TLS without verifying the CCM's self-signed
// certificate, with a bearer token if one is given (all of a /metrics page).
func get(url, token string) (int, string, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, string(body), err
}
