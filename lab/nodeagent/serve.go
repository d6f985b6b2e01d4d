package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ListenFunc opens a TCP listener, like net.ListenConfig.Listen.
type ListenFunc func(ctx context.Context, network, address string) (net.Listener, error)

// NameServer answers HTTP on a set of VIP:port listeners with the node name
// followed by a newline. Sync changes the set; Close stops everything.
type NameServer struct {
	body   []byte
	listen ListenFunc

	mu      sync.Mutex
	servers map[netip.AddrPort]*http.Server
	wg      sync.WaitGroup
}

// NewNameServer returns a NameServer answering "<nodeName>\n". listen may be
// nil: then the listeners bind with IP_FREEBIND/IPV6_FREEBIND.
func NewNameServer(nodeName string, listen ListenFunc) *NameServer {
	if listen == nil {
		lc := net.ListenConfig{Control: freebind}
		listen = lc.Listen
	}
	return &NameServer{
		body:    []byte(nodeName + "\n"),
		listen:  listen,
		servers: map[netip.AddrPort]*http.Server{},
	}
}

// ServeHTTP answers every request with the node name.
func (s *NameServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", fmt.Sprint(len(s.body)))
	_, _ = w.Write(s.body)
}

// Listening returns the endpoints being served, sorted.
func (s *NameServer) Listening() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.AddrPort, 0, len(s.servers))
	for ap := range s.servers {
		out = append(out, ap)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Stop closes the listeners on the given endpoints.
func (s *NameServer) Stop(ctx context.Context, eps []netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ap := range eps {
		if srv, ok := s.servers[ap]; ok {
			_ = srv.Close()
			delete(s.servers, ap)
			klog.FromContext(ctx).Info("Stopped serving", "endpoint", ap)
		}
	}
}

// Start serves on the given endpoints; endpoints already served are left
// alone. Every endpoint is tried; the errors are joined.
func (s *NameServer) Start(ctx context.Context, eps []netip.AddrPort) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logger := klog.FromContext(ctx)
	var errs []error
	for _, ap := range eps {
		if _, ok := s.servers[ap]; ok {
			continue
		}
		ln, err := s.listen(ctx, "tcp", ap.String())
		if err != nil {
			errs = append(errs, fmt.Errorf("listen on %s: %w", ap, err))
			continue
		}
		srv := &http.Server{
			Handler:           s,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       30 * time.Second,
		}
		s.servers[ap] = srv
		s.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "HTTP server stopped", "endpoint", ap)
			}
		})
		logger.Info("Serving node name", "endpoint", ap)
	}
	return errors.Join(errs...)
}

// Close stops every listener and waits for the servers to return.
func (s *NameServer) Close() {
	s.mu.Lock()
	for ap, srv := range s.servers {
		_ = srv.Close()
		delete(s.servers, ap)
	}
	s.mu.Unlock()
	s.wg.Wait()
}
