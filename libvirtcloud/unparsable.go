package libvirtcloud

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"libvirt.org/go/libvirt"
)

// ErrUnparsable means the hypervisor holds the domain but its definition
// cannot be parsed. The domain exists, so this is never ErrNotFound: a
// Node is not deleted for it.
var ErrUnparsable = errors.New("domain definition cannot be parsed")

// Bounds on what a domain's definition puts into errors, logs and events:
// its name as long as a Node's may be, the parse error a line long.
const (
	maxNameEcho   = 253
	maxReasonEcho = 200
)

// UnparsableDomain is a domain left out of the cache because its
// definition cannot be parsed. One bad definition must not hide the
// hypervisor's other domains.
type UnparsableDomain struct {
	UUID       string // lower case
	Name       string // its first 253 bytes and "…" if longer
	Hypervisor string // the zone of the hypervisor holding it
	State      State
	Reason     string    // the parse error: its first 200 bytes and "…" if longer
	Since      time.Time // when it was first found unparsable for Reason
}

// unparsableError is a lookup's answer for an unparsable domain.
type unparsableError struct {
	domain UnparsableDomain
	uri    string
}

func (e *unparsableError) Error() string {
	return fmt.Sprintf("domain %q (uuid %s) on %s: %v: %s", e.domain.Name, e.domain.UUID, e.uri, ErrUnparsable, e.domain.Reason)
}

func (e *unparsableError) Is(target error) bool { return target == ErrUnparsable }

// unparsable describes dom, whose definition parseDomainXML rejected with
// err. Name and UUID are read from the handle, which costs no call.
func (h *Hypervisor) unparsable(dom *libvirt.Domain, state State, err error) *unparsableError {
	name, _ := dom.GetName()
	uuid, _ := dom.GetUUIDString()
	return &unparsableError{uri: h.opts.URI, domain: UnparsableDomain{
		UUID:       strings.ToLower(uuid),
		Name:       cut(name, maxNameEcho),
		Hypervisor: h.opts.Zone,
		State:      state,
		Reason:     cut(err.Error(), maxReasonEcho),
		Since:      time.Now(),
	}}
}

// Unparsable returns the domains left out of the cache because their
// definitions cannot be parsed, by UUID.
func (h *Hypervisor) Unparsable() []UnparsableDomain {
	h.mu.RLock()
	out := make([]UnparsableDomain, 0, len(h.bad))
	for _, u := range h.bad {
		out = append(out, u)
	}
	h.mu.RUnlock()
	slices.SortFunc(out, func(a, b UnparsableDomain) int { return strings.Compare(a.UUID, b.UUID) })
	return out
}

// noteBad records u in place of any cached snapshot of the same domain,
// and reports it if it is news: not known unparsable before, or for
// another reason.
func (h *Hypervisor) noteBad(log logr.Logger, u UnparsableDomain) {
	h.mu.Lock()
	h.domains.remove(u.UUID)
	prev, had := h.bad[u.UUID]
	news := !had || prev.Reason != u.Reason
	if !news {
		u.Since = prev.Since
	}
	h.bad[u.UUID] = u
	h.cached()
	h.mu.Unlock()
	if news {
		h.reportBad(log, []UnparsableDomain{u}, nil)
	}
}

// badByName finds an unparsable domain by name. Callers hold mu.
func (h *Hypervisor) badByName(name string) (UnparsableDomain, bool) {
	for _, u := range h.bad {
		if u.Name == name {
			return u, true
		}
	}
	return UnparsableDomain{}, false
}

// reportBad logs and publishes domains newly found unparsable, once per
// domain and reason, and those that parse again.
func (h *Hypervisor) reportBad(log logr.Logger, news []UnparsableDomain, healed []Domain) {
	for _, u := range news {
		// A warning: the rest of the hypervisor is served.
		log.Info("Skipping domain whose definition cannot be parsed", "hypervisor", h.opts.URI,
			"domain", u.Name, "uuid", u.UUID, "reason", u.Reason)
		h.subs.publish(Event{Domain: Domain{UUID: u.UUID, Name: u.Name, Hypervisor: u.Hypervisor, State: u.State}, Unparsable: &u})
	}
	for _, d := range healed {
		log.Info("Domain definition parses again", "hypervisor", h.opts.URI, "domain", d.Name, "uuid", d.UUID)
	}
}

// cut shortens s to at most n bytes on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
