package lab

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// HostnameAt is agnhost netexec's /hostname through vip (an address of
// either family, port 80, or host:port), asked on a new connection (as
// curl does: a kept-alive one to a node that just died would stall the
// next) within timeout: the answering pod's name, or "" without an answer.
func HostnameAt(vip string, timeout time.Duration) string {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	target := vip // host:port as it is; an address of either family on port 80
	if a, err := netip.ParseAddr(vip); err == nil {
		target = net.JoinHostPort(a.String(), "80")
	}
	resp, err := c.Get("http://" + target + "/hostname")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return strings.TrimSpace(string(b))
}
