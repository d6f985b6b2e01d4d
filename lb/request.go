package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go4.org/netipx"
	v1 "k8s.io/api/core/v1"
)

// Annotations a Service may carry to steer its VIP.
const (
	// AnnotationIP requests VIPs: comma separated, at most one per family.
	AnnotationIP = "lb.labcloud.io/ip"
	// AnnotationPool names the pool to allocate from.
	AnnotationPool = "lb.labcloud.io/pool"
	// AnnotationSharingKey lets Services with the same key share a VIP
	// when their ports do not overlap.
	AnnotationSharingKey = "lb.labcloud.io/sharing-key"
	// FieldLoadBalancerIP is the deprecated spec field, read when
	// AnnotationIP is absent.
	FieldLoadBalancerIP = "spec.loadBalancerIP"
	// FieldIPFamilies is the spec field that says which families get a VIP.
	FieldIPFamilies = "spec.ipFamilies"
	// FieldIPFamilyPolicy is the spec field that says whether every family
	// listed must get a VIP.
	FieldIPFamilyPolicy = "spec.ipFamilyPolicy"
)

// maxSharingKey bounds the sharing key; it appears in events and logs.
const maxSharingKey = 253

// Port is one port a Service exposes; two Services sharing a VIP must not
// both use the same protocol and port.
type Port struct {
	Protocol string // "TCP", "UDP" or "SCTP"
	Port     int32
}

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Request is what a Service asks of the allocator.
type Request struct {
	// Families get one VIP each, in the Service's order. Never empty in a
	// parsed Request.
	Families []Family
	// Policy says which Families may go without a VIP; "" is SingleStack.
	Policy FamilyPolicy
	// IPs are the requested VIPs, at most one per family, in the order of
	// Families.
	IPs []netip.Addr
	// Pool restricts allocation to one pool; "" means any pool.
	Pool string
	// SharingKey, when not "", allows sharing a VIP with Services of the
	// same key.
	SharingKey string
	// Ports are the Service's ports, checked against co-holders of a
	// shared VIP.
	Ports []Port
	// NamespaceLabels are the labels of the Service's namespace, read only
	// when a pool has a namespaceSelector (Pools.SelectsNamespaces).
	NamespaceLabels map[string]string
}

// IP returns the requested address of family f, if any.
func (r Request) IP(f Family) (netip.Addr, bool) {
	for _, ip := range r.IPs {
		if FamilyOf(ip) == f {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// RequestError says which annotation or field of a Service is wrong and
// why; the provider turns it into an event on the Service.
type RequestError struct {
	Field string // an annotation name or a spec field, e.g. AnnotationIP
	Value string
	Err   error
}

// Error quotes at most maxEcho bytes of the value and of the reason: the
// error is kept per Service and written into events and logs on every
// retry, and the value is whatever the Service's author wrote.
func (e *RequestError) Error() string {
	return fmt.Sprintf("%s=%s: %s", e.Field, quoteClipped(e.Value), clip(fmt.Sprint(e.Err), 2*maxEcho))
}

// maxEcho bounds what an error quotes of a user's value.
const maxEcho = 128

// quoteClipped quotes s, cut to maxEcho bytes with its full length said.
func quoteClipped(s string) string {
	if len(s) <= maxEcho {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q... (%d bytes)", clip(s, maxEcho), len(s))
}

// clip cuts s to at most n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func (e *RequestError) Unwrap() error { return e.Err }

// ParseRequest reads a Service's annotations, spec.loadBalancerIP,
// spec.ipFamilies, spec.ipFamilyPolicy and ports into a Request. Errors are
// *RequestError.
func ParseRequest(svc *v1.Service) (Request, error) {
	if svc == nil {
		return Request{}, errors.New("nil Service")
	}
	ips, field, err := requestedIPs(svc)
	if err != nil {
		return Request{}, err
	}
	policy, err := parsePolicy(svc.Spec.IPFamilyPolicy)
	if err != nil {
		return Request{}, &RequestError{Field: FieldIPFamilyPolicy, Value: string(*svc.Spec.IPFamilyPolicy), Err: err}
	}
	fams, err := parseFamilies(svc.Spec.IPFamilies)
	if err != nil {
		return Request{}, &RequestError{Field: FieldIPFamilies, Value: fmt.Sprint(svc.Spec.IPFamilies), Err: err}
	}
	if len(fams) == 0 {
		// Before the API server defaults ipFamilies.
		fams = defaultFamilies(ips, policy)
	}
	if err := missingFamily(policy, fams); err != nil {
		return Request{}, &RequestError{Field: FieldIPFamilies, Value: fmt.Sprint(svc.Spec.IPFamilies), Err: err}
	}
	req := Request{Families: fams, Policy: policy}
	for _, ip := range ips {
		if !slices.Contains(fams, FamilyOf(ip)) {
			return Request{}, &RequestError{Field: field, Value: fieldValue(svc, field),
				Err: fmt.Errorf("%s is %s but the Service's families are %v", ip, FamilyOf(ip), fams)}
		}
	}
	for _, f := range fams {
		if ip, ok := (Request{IPs: ips}).IP(f); ok {
			req.IPs = append(req.IPs, ip)
		}
	}

	ann := svc.Annotations
	if raw := ann[AnnotationPool]; strings.TrimSpace(raw) != "" {
		req.Pool = strings.TrimSpace(raw)
		if err := validName(req.Pool); err != nil {
			return Request{}, &RequestError{Field: AnnotationPool, Value: raw, Err: err}
		}
	}
	if raw := ann[AnnotationSharingKey]; strings.TrimSpace(raw) != "" {
		req.SharingKey = strings.TrimSpace(raw)
		if err := validSharingKey(req.SharingKey); err != nil {
			return Request{}, &RequestError{Field: AnnotationSharingKey, Value: raw, Err: err}
		}
	}
	req.Ports = PortsOf(svc.Spec.Ports)
	return req, nil
}

// requestedIPs reads AnnotationIP, or else the deprecated
// spec.loadBalancerIP, and says which of the two it used.
func requestedIPs(svc *v1.Service) ([]netip.Addr, string, error) {
	raw, lbIP := svc.Annotations[AnnotationIP], strings.TrimSpace(svc.Spec.LoadBalancerIP)
	if strings.TrimSpace(raw) == "" {
		if lbIP == "" {
			return nil, "", nil
		}
		ip, err := parseAddr(lbIP)
		if err == nil {
			err = vipAddr(ip)
		}
		if err != nil {
			return nil, "", &RequestError{Field: FieldLoadBalancerIP, Value: svc.Spec.LoadBalancerIP, Err: err}
		}
		return []netip.Addr{ip}, FieldLoadBalancerIP, nil
	}
	ips, err := parseIPList(raw)
	if err != nil {
		return nil, "", &RequestError{Field: AnnotationIP, Value: raw, Err: err}
	}
	// Both set and disagreeing is ambiguous; say so rather than silently
	// preferring one.
	if lbIP != "" {
		if ip, err := netip.ParseAddr(lbIP); err != nil || !slices.Contains(ips, ip) {
			return nil, "", &RequestError{Field: FieldLoadBalancerIP, Value: svc.Spec.LoadBalancerIP,
				Err: fmt.Errorf("disagrees with %s=%q", AnnotationIP, raw)}
		}
	}
	return ips, AnnotationIP, nil
}

// fieldValue returns the raw value of AnnotationIP or FieldLoadBalancerIP.
func fieldValue(svc *v1.Service, field string) string {
	if field == FieldLoadBalancerIP {
		return svc.Spec.LoadBalancerIP
	}
	return svc.Annotations[field]
}

// parseIPList reads "ip[,ip]" with at most one address per family.
func parseIPList(raw string) ([]netip.Addr, error) {
	var ips []netip.Addr
	for s := range strings.SplitSeq(raw, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, errors.New("empty address in list")
		}
		ip, err := parseAddr(s)
		if err != nil {
			return nil, err
		}
		if err := vipAddr(ip); err != nil {
			return nil, err
		}
		for _, prev := range ips {
			if FamilyOf(prev) == FamilyOf(ip) {
				return nil, fmt.Errorf("two %s addresses (%s, %s); at most one per family", FamilyOf(ip), prev, ip)
			}
		}
		ips = append(ips, ip)
	}
	return ips, nil
}

// vipAddr rejects addresses that can never be a unicast VIP, so the user
// hears about it at once instead of as "not in any pool".
func vipAddr(ip netip.Addr) error {
	if err := checkUsable(netipx.IPRangeFrom(ip, ip)); err != nil {
		return fmt.Errorf("%s %w", ip, err)
	}
	return nil
}

func validSharingKey(key string) error {
	if len(key) > maxSharingKey {
		return fmt.Errorf("longer than %d bytes", maxSharingKey)
	}
	for _, c := range key {
		if unicode.IsSpace(c) || !unicode.IsPrint(c) {
			return fmt.Errorf("character %q not allowed", c)
		}
	}
	return nil
}

// PortsOf returns the protocol/port pairs of a Service; an empty protocol
// is TCP, as the API server defaults it.
func PortsOf(ports []v1.ServicePort) []Port {
	out := make([]Port, 0, len(ports))
	for _, p := range ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(v1.ProtocolTCP)
		}
		out = append(out, Port{Protocol: proto, Port: p.Port})
	}
	return out
}

// Annotations returns the annotations that make ParseRequest give back r's
// IPs, pool and sharing key; families, policy and ports live in the
// Service spec.
func (r Request) Annotations() map[string]string {
	ann := map[string]string{}
	if len(r.IPs) > 0 {
		s := make([]string, len(r.IPs))
		for i, ip := range r.IPs {
			s[i] = ip.String()
		}
		ann[AnnotationIP] = strings.Join(s, ",")
	}
	if r.Pool != "" {
		ann[AnnotationPool] = r.Pool
	}
	if r.SharingKey != "" {
		ann[AnnotationSharingKey] = r.SharingKey
	}
	return ann
}

// families checks a Request built by hand as ParseRequest would and
// returns the families to allocate.
func (r Request) families() ([]Family, error) {
	if !r.Policy.valid() {
		return nil, fmt.Errorf("policy %q: %w", r.Policy, ErrInvalidRequest)
	}
	fams := r.Families
	if len(fams) == 0 {
		fams = defaultFamilies(r.IPs, r.Policy)
	}
	for i, f := range fams {
		if f != IPv4 && f != IPv6 || slices.Contains(fams[:i], f) {
			return nil, fmt.Errorf("families %v: %w", fams, ErrInvalidRequest)
		}
	}
	if err := missingFamily(r.Policy, fams); err != nil {
		return nil, fmt.Errorf("families %v: %w: %w", fams, err, ErrInvalidRequest)
	}
	var seen [2]bool
	for _, ip := range r.IPs {
		f := FamilyOf(ip)
		if !ip.IsValid() || plainAddr(ip) != nil || seen[f.index()] || !slices.Contains(fams, f) {
			return nil, fmt.Errorf("requested addresses %v for families %v: %w", r.IPs, fams, ErrInvalidRequest)
		}
		seen[f.index()] = true
	}
	return fams, nil
}
