package libvirtcloud

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
)

// withConn runs f with the live connection, or fails with ErrUnavailable.
func (h *Hypervisor) withConn(f func(*libvirt.Connect) error) error {
	h.connMu.RLock()
	defer h.connMu.RUnlock()
	if h.conn == nil {
		return fmt.Errorf("%s: %w", h.opts.URI, ErrUnavailable)
	}
	return f(h.conn)
}

// DomainByUUID returns the domain with this UUID: from the cache, else by
// asking the hypervisor, so ErrNotFound is always the hypervisor's answer.
func (h *Hypervisor) DomainByUUID(uuid string) (Domain, error) {
	uuid = strings.ToLower(uuid)
	if !h.Connected() {
		return Domain{}, fmt.Errorf("domain %s on %s: %w", uuid, h.opts.URI, ErrUnavailable)
	}
	h.mu.RLock()
	d, ok := h.domains.byUUID[uuid]
	bad, isBad := h.bad[uuid]
	h.mu.RUnlock()
	if ok {
		return d, nil
	}
	if isBad {
		return Domain{}, &unparsableError{domain: bad, uri: h.opts.URI}
	}
	return h.lookup(fmt.Sprintf("uuid %s", uuid), "LookupDomainByUUIDString", func(c *libvirt.Connect) (*libvirt.Domain, error) {
		return c.LookupDomainByUUIDString(uuid)
	})
}

// DomainByName is DomainByUUID for a domain name.
func (h *Hypervisor) DomainByName(name string) (Domain, error) {
	if !h.Connected() {
		return Domain{}, fmt.Errorf("domain %q on %s: %w", name, h.opts.URI, ErrUnavailable)
	}
	h.mu.RLock()
	d, ok := h.domains.byNameLookup(name)
	var bad UnparsableDomain
	isBad := false
	if !ok {
		bad, isBad = h.badByName(name)
	}
	h.mu.RUnlock()
	if ok {
		return d, nil
	}
	if isBad {
		return Domain{}, &unparsableError{domain: bad, uri: h.opts.URI}
	}
	return h.lookup(fmt.Sprintf("name %q", name), "LookupDomainByName", func(c *libvirt.Connect) (*libvirt.Domain, error) {
		return c.LookupDomainByName(name)
	})
}

// lookup asks the hypervisor for a domain the cache does not hold (with
// find, the libvirt call named call) and caches the answer.
func (h *Hypervisor) lookup(what, call string, find func(*libvirt.Connect) (*libvirt.Domain, error)) (Domain, error) {
	var d Domain
	err := h.withConn(func(c *libvirt.Connect) error {
		start := time.Now()
		dom, err := find(c)
		h.called(call, start)
		if err != nil {
			return err
		}
		defer dom.Free()
		d, err = h.describe(dom)
		return err
	})
	var unparsable *unparsableError
	switch {
	case isNoDomain(err):
		return Domain{}, fmt.Errorf("domain with %s on %s: %w", what, h.opts.URI, ErrNotFound)
	case errors.Is(err, ErrUnavailable):
		return Domain{}, err
	case errors.As(err, &unparsable):
		h.noteBad(h.log, unparsable.domain)
		return Domain{}, err
	case err != nil:
		return Domain{}, fmt.Errorf("domain with %s on %s: %w: %w", what, h.opts.URI, ErrUnavailable, err)
	}
	h.mu.Lock()
	_, had := h.domains.put(d)
	h.cached()
	h.mu.Unlock()
	if !had {
		h.subs.publish(Event{Domain: d})
	}
	return d, nil
}

// Domains returns a snapshot of every cached domain.
func (h *Hypervisor) Domains() []Domain {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]Domain, 0, len(h.domains.byUUID))
	for _, d := range h.domains.byUUID {
		out = append(out, d)
	}
	return out
}

// Subscribe returns a channel of domain changes (state changes, additions,
// removals) and a function that ends the subscription.
func (h *Hypervisor) Subscribe() (<-chan Event, func()) { return h.subs.subscribe() }

func isNoDomain(err error) bool {
	var lerr libvirt.Error
	return errors.As(err, &lerr) && lerr.Code == libvirt.ERR_NO_DOMAIN
}

func isUnsupported(err error) bool {
	var lerr libvirt.Error
	return errors.As(err, &lerr) && (lerr.Code == libvirt.ERR_NO_SUPPORT || lerr.Code == libvirt.ERR_OPERATION_UNSUPPORTED)
}
