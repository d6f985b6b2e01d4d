package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// ProbePort is the port of lab-node's probe server. It listens on every
// address of the guest, the pod address on pod0 included, so the lab can
// check pod-to-pod reachability without running pods. A Service port of
// 9099 would collide with it on the VIPs.
const ProbePort = 9099

// Probe answers the lab's reachability probes:
//
//	GET /            the node name and a newline
//	GET /reach?addr=A  GET http://A:<port>/ from this node (2 s timeout)
//	                 and answer with its body; 502 with the error if it
//	                 fails, 400 if A is not an IP address
type Probe struct {
	body   []byte
	port   int
	client *http.Client
}

// NewProbe returns the probe of nodeName; /reach asks peers on peerPort
// (ProbePort in a lab; tests use other ports).
func NewProbe(nodeName string, peerPort int) *Probe {
	return &Probe{
		body: []byte(nodeName + "\n"),
		port: peerPort,
		// No proxy from the environment: the probe tests the direct path.
		client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
}

// ServeHTTP implements http.Handler.
func (p *Probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/":
		_, _ = w.Write(p.body)
	case "/reach":
		p.reach(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (p *Probe) reach(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("addr")
	addr, err := netip.ParseAddr(raw)
	if err != nil {
		http.Error(w, fmt.Sprintf("addr %q: want an IP address", raw), http.StatusBadRequest)
		return
	}
	url := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(p.port)) + "/"
	body, err := p.get(r.Context(), url)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	_, _ = w.Write(body)
}

// get fetches url and returns at most 4 KiB of a 200 answer's body.
func (p *Probe) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("request %s: %w", url, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// ServeProbe serves h on ln until ctx ends; it closes ln.
func ServeProbe(ctx context.Context, ln net.Listener, h http.Handler) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.FromContext(ctx).Error(err, "Probe server stopped", "address", ln.Addr())
	}
}
