package lanprobe

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// Hostname is agnhost netexec's /hostname at target (an address of either
// family, port 80, or host:port), asked from this namespace on a new
// connection (as curl does: a kept-alive one to a node that just died
// would stall the next) within timeout: the answering pod's name, or ""
// without an answer.
func Hostname(target string, timeout time.Duration) string { return hostname(target, timeout, nil) }

// Hostname is Hostname asked from the client.
func (c *Client) Hostname(target string, timeout time.Duration) string {
	return hostname(target, timeout, c.dial)
}

// dial dials from the client's namespace.
func (c *Client) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := c.Do(func() (err error) {
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

func hostname(target string, timeout time.Duration, dial func(context.Context, string, string) (net.Conn, error)) string {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
	if a, err := netip.ParseAddr(target); err == nil { // an address of either family on port 80
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
