package labe2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/labcloud/labcloud/lab/uplink"
)

// checkReach checks the uplink of a lab that is up, from this test's own
// namespace (the host's): a VIP and a pod IP answer it without labcloud
// exec, and a pod fetches from an HTTP server on the host's own address,
// by address and by a name the test puts in the host's /etc/hosts (which
// cluster DNS answers from). TestLab calls it once its nodes are Ready.
func checkReach(t *testing.T, l *labcloud) {
	t.Helper()
	l.apply(netexec("reach", 1, "") + "---\n" + loadBalancer("reach", false))
	var vip, podIP string
	eventually(t, "the reach Service's VIP and pod", 3*time.Minute, time.Second, func() string {
		vip, _ = l.announcer("default/reach")
		for _, ip := range podIPs(l, "reach") {
			podIP = ip
		}
		if vip == "" || podIP == "" {
			return fmt.Sprintf("VIP %q, pod IP %q", vip, podIP)
		}
		return ""
	})
	for _, u := range []string{"http://" + vip + "/hostname", "http://" + net.JoinHostPort(podIP, "8080") + "/hostname"} {
		eventually(t, "GET "+u+" from the host's namespace", time.Minute, time.Second, func() string {
			if got, err := hostGet(u); err != nil || !strings.HasPrefix(got, "reach-") {
				return fmt.Sprintf("%q, %v; want a reach pod's name", got, err)
			}
			return ""
		})
	}

	// A server on the host's own address, outside the lab.
	hostIP := hostAddress(t)
	token := fmt.Sprintf("reach-%d", time.Now().UnixNano())
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, token) })}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	const name = "labcloud-reach.test"
	restore := addHostsEntry(t, name, hostIP.String())
	defer restore()
	for _, host := range []string{hostIP.String(), name} {
		// agnhost netexec's /dial makes the request from the pod.
		q := url.Values{"request": {"/"}, "host": {host}, "port": {fmt.Sprint(port)}, "protocol": {"http"}, "tries": {"1"}}
		u := "http://" + net.JoinHostPort(podIP, "8080") + "/dial?" + q.Encode()
		eventually(t, "the pod fetching from "+host+":"+fmt.Sprint(port), time.Minute, 2*time.Second, func() string {
			if got, err := hostGet(u); err != nil || !strings.Contains(got, token) {
				return fmt.Sprintf("%q, %v; want the host server's token", got, err)
			}
			return ""
		})
	}
	checkInsecureRegistry(t, l, hostIP)
	l.mustKubectl("delete", "service,deployment", "reach")
}

// insecureRegistry is the name TestLab's up gives --insecure-registry: a
// registry on the host's own address, named in the host's /etc/hosts.
const insecureRegistry = "labcloud-registry.test:5000"

// checkInsecureRegistry serves a plain-HTTP registry on the host's own
// address under insecureRegistry's name, pushes an image nobody loaded,
// and runs a pod of it: the node resolves the name through cluster DNS
// (the host's /etc/hosts) and pulls from the host over the uplink.
func checkInsecureRegistry(t *testing.T, l *labcloud, hostIP netip.Addr) {
	t.Helper()
	host, port, _ := net.SplitHostPort(insecureRegistry)
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP.String(), port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	defer srv.Close()
	restore := addHostsEntry(t, host, hostIP.String())
	defer restore()
	token := randomHex(t)
	if err := remote.Write(mustRef(t, net.JoinHostPort(hostIP.String(), port)+"/reach/app:v1"), busyboxImage(t, token)); err != nil {
		t.Fatal(err)
	}
	l.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: from-host-registry}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: %s/reach/app:v1, readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}}
`, insecureRegistry))
	l.mustKubectl("wait", "--for=condition=Ready", "pod/from-host-registry", "--timeout=5m")
	ip := l.mustKubectl("get", "pod", "from-host-registry", "-o", "jsonpath={.status.podIP}")
	if got, err := hostGet("http://" + net.JoinHostPort(ip, "8080") + "/"); err != nil || got != token {
		t.Errorf("the pod of %s/reach/app:v1 answered %q %v, want the pushed image's token", insecureRegistry, got, err)
	}
	l.mustKubectl("delete", "pod", "from-host-registry", "--wait=false")
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkUplinkGone checks, after down, that the host has nothing of the
// uplink left.
func checkUplinkGone(t *testing.T) {
	t.Helper()
	if _, err := net.InterfaceByName(uplink.HostLink); err == nil {
		t.Errorf("%s left behind by down", uplink.HostLink)
	}
	for _, fam := range []string{"-4", "-6"} {
		if out, _ := exec.Command("ip", fam, "route", "show", "table", "all", "proto", fmt.Sprint(uplink.Protocol)).Output(); len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("routes of protocol %d left behind by down: %s", uplink.Protocol, out)
		}
	}
}

func podIPs(l *labcloud, app string) []string {
	_, ips := l.podsOf(app)
	var out []string
	for _, ip := range ips {
		out = append(out, ip)
	}
	return out
}

// hostGet fetches u from this process's namespace, the host's.
func hostGet(u string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return strings.TrimSpace(string(b)), err
}

// hostAddress is the host's address on its default route (no packet is
// sent: a UDP socket only picks its source).
func hostAddress(t *testing.T) netip.Addr {
	t.Helper()
	c, err := net.Dial("udp4", "192.0.2.123:9")
	if err != nil {
		t.Skipf("the host has no IPv4 default route to serve from: %v", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
}

// addHostsEntry names addr in the host's /etc/hosts; the returned func
// puts the file back as it was.
func addHostsEntry(t *testing.T, name, addr string) func() {
	t.Helper()
	const hosts = "/etc/hosts"
	old, err := os.ReadFile(hosts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hosts, append(old, fmt.Sprintf("\n%s %s\n", addr, name)...), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(hosts, old, 0o644); err != nil {
			t.Errorf("restore %s: %v", hosts, err)
		}
	}
}
