package lb

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ErrPoolNotForNamespace marks a request for a pool kept for other
// namespaces.
var ErrPoolNotForNamespace = errors.New("pool kept for other namespaces")

// PoolNotForNamespaceError: Namespace asked for Pool (by name or by an
// address in it), which is kept for other namespaces.
type PoolNotForNamespaceError struct {
	Pool, Namespace string
}

func (e *PoolNotForNamespaceError) Error() string {
	return fmt.Sprintf("pool %q is kept for other namespaces than %s", e.Pool, e.Namespace)
}

func (e *PoolNotForNamespaceError) Unwrap() error { return ErrPoolNotForNamespace }

// keepFor restricts p to the named namespaces and those sel matches.
func (p *Pool) keepFor(names []string, sel *metav1.LabelSelector) error {
	for _, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return fmt.Errorf("namespaces: %s: %s", quoteClipped(n), strings.Join(errs, "; "))
		}
	}
	p.namespaces = slices.Sorted(slices.Values(names))
	p.namespaces = slices.Compact(p.namespaces)
	if sel == nil {
		return nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return fmt.Errorf("namespaceSelector: %w", err)
	}
	if s.Empty() {
		return errors.New("namespaceSelector: empty; it would serve every namespace, so leave it out")
	}
	p.selector = s
	return nil
}

// Restricted reports whether the pool is kept for some namespaces.
func (p *Pool) Restricted() bool { return len(p.namespaces) > 0 || p.selector != nil }

// Serves reports whether the pool serves Services of namespace ns, whose
// labels are nsLabels (only read when the pool has a selector).
func (p *Pool) Serves(ns string, nsLabels map[string]string) bool {
	if !p.Restricted() {
		return true
	}
	if _, found := slices.BinarySearch(p.namespaces, ns); found {
		return true
	}
	return p.selector != nil && p.selector.Matches(labels.Set(nsLabels))
}

// SelectsNamespaces reports whether a pool has a namespace selector, so
// that requests must carry their namespace's labels.
func (ps *Pools) SelectsNamespaces() bool {
	return slices.ContainsFunc(ps.list, func(p *Pool) bool { return p.selector != nil })
}

// serving are the pools, in configuration order, that serve key's
// namespace.
func (ps *Pools) serving(key string, nsLabels map[string]string) []*Pool {
	ns, _, _ := strings.Cut(key, "/")
	var out []*Pool
	for _, p := range ps.list {
		if p.Serves(ns, nsLabels) {
			out = append(out, p)
		}
	}
	return out
}
