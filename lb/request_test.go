package lb

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ann map[string]string, lbIP string, fams ...v1.IPFamily) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc", Annotations: ann},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeLoadBalancer,
			LoadBalancerIP: lbIP,
			IPFamilies:     fams,
			Ports: []v1.ServicePort{
				{Port: 80, Protocol: v1.ProtocolTCP},
				{Port: 53},
				{Port: 53, Protocol: v1.ProtocolUDP},
			},
		},
	}
}

func withPolicy(svc *v1.Service, p v1.IPFamilyPolicy) *v1.Service {
	svc.Spec.IPFamilyPolicy = &p
	return svc
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestParseRequest(t *testing.T) {
	ports := []Port{{"TCP", 80}, {"TCP", 53}, {"UDP", 53}}
	tests := []struct {
		name      string
		svc       *v1.Service
		want      Request
		wantField string // the field a *RequestError must name; "" for success
		wantValue string
		wantSays  string // what else the error must say
	}{
		{
			name: "nothing asked",
			svc:  service(nil, ""),
			want: Request{Families: []Family{IPv4}, Ports: ports},
		},
		{
			name: "everything asked",
			svc: service(map[string]string{
				AnnotationIP:         " 192.168.50.10 ",
				AnnotationPool:       "lan",
				AnnotationSharingKey: "web",
				"other.example/x":    "ignored",
			}, "", v1.IPv4Protocol),
			want: Request{Families: []Family{IPv4}, IPs: addrs("192.168.50.10"), Pool: "lan", SharingKey: "web", Ports: ports},
		},
		{
			name: "dual stack, IPs follow family order",
			svc:  service(map[string]string{AnnotationIP: "fd00::10,192.168.50.10"}, "", v1.IPv4Protocol, v1.IPv6Protocol),
			want: Request{Families: []Family{IPv4, IPv6}, IPs: addrs("192.168.50.10", "fd00::10"), Ports: ports},
		},
		{
			name: "families from the IPs when spec has none",
			svc:  service(map[string]string{AnnotationIP: "fd00::10"}, ""),
			want: Request{Families: []Family{IPv6}, IPs: addrs("fd00::10"), Ports: ports},
		},
		{
			name: "dual stack with one IP requested",
			svc:  service(map[string]string{AnnotationIP: "fd00::10"}, "", v1.IPv6Protocol, v1.IPv4Protocol),
			want: Request{Families: []Family{IPv6, IPv4}, IPs: addrs("fd00::10"), Ports: ports},
		},
		{
			name: "deprecated loadBalancerIP",
			svc:  service(nil, "192.168.50.11"),
			want: Request{Families: []Family{IPv4}, IPs: addrs("192.168.50.11"), Ports: ports},
		},
		{
			name: "loadBalancerIP agreeing with annotation",
			svc:  service(map[string]string{AnnotationIP: "192.168.50.11,fd00::1"}, "fd00::1", v1.IPv4Protocol, v1.IPv6Protocol),
			want: Request{Families: []Family{IPv4, IPv6}, IPs: addrs("192.168.50.11", "fd00::1"), Ports: ports},
		},
		{
			name: "blank annotations mean unset",
			svc:  service(map[string]string{AnnotationIP: " ", AnnotationPool: "", AnnotationSharingKey: "  "}, ""),
			want: Request{Families: []Family{IPv4}, Ports: ports},
		},
		{name: "bad IP", svc: service(map[string]string{AnnotationIP: "192.168.50.300"}, ""), wantField: AnnotationIP, wantValue: "192.168.50.300"},
		{name: "two IPv4", svc: service(map[string]string{AnnotationIP: "10.0.0.1,10.0.0.2"}, ""), wantField: AnnotationIP, wantValue: "10.0.0.1,10.0.0.2"},
		{name: "empty list item", svc: service(map[string]string{AnnotationIP: "10.0.0.1,"}, ""), wantField: AnnotationIP, wantValue: "10.0.0.1,"},
		{name: "CIDR is not an IP", svc: service(map[string]string{AnnotationIP: "10.0.0.0/24"}, ""), wantField: AnnotationIP, wantValue: "10.0.0.0/24"},
		{name: "zone", svc: service(map[string]string{AnnotationIP: "fe80::1%eth0"}, ""), wantField: AnnotationIP, wantValue: "fe80::1%eth0"},
		{name: "mapped", svc: service(map[string]string{AnnotationIP: "::ffff:10.0.0.1"}, ""), wantField: AnnotationIP, wantValue: "::ffff:10.0.0.1"},
		{name: "unspecified", svc: service(map[string]string{AnnotationIP: "0.0.0.0"}, ""), wantField: AnnotationIP, wantValue: "0.0.0.0"},
		{name: "multicast", svc: service(map[string]string{AnnotationIP: "224.0.0.1"}, ""), wantField: AnnotationIP, wantValue: "224.0.0.1"},
		{
			name:      "IP of a family the Service lacks",
			svc:       service(map[string]string{AnnotationIP: "fd00::1"}, "", v1.IPv4Protocol),
			wantField: AnnotationIP, wantValue: "fd00::1",
		},
		{name: "bad loadBalancerIP", svc: service(nil, "nope"), wantField: FieldLoadBalancerIP, wantValue: "nope"},
		{
			name:      "loadBalancerIP disagrees",
			svc:       service(map[string]string{AnnotationIP: "10.0.0.1"}, "10.0.0.2"),
			wantField: FieldLoadBalancerIP, wantValue: "10.0.0.2",
		},
		{name: "bad pool name", svc: service(map[string]string{AnnotationPool: "a/b"}, ""), wantField: AnnotationPool, wantValue: "a/b"},
		{name: "bad sharing key", svc: service(map[string]string{AnnotationSharingKey: "a b"}, ""), wantField: AnnotationSharingKey, wantValue: "a b"},
		{name: "long sharing key", svc: service(map[string]string{AnnotationSharingKey: strings.Repeat("k", 254)}, ""), wantField: AnnotationSharingKey, wantValue: strings.Repeat("k", 254)},
		{
			name: "SingleStack",
			svc:  withPolicy(service(nil, "", v1.IPv4Protocol), v1.IPFamilyPolicySingleStack),
			want: Request{Families: []Family{IPv4}, Policy: SingleStack, Ports: ports},
		},
		{
			name: "PreferDualStack with one family listed",
			svc:  withPolicy(service(nil, "", v1.IPv6Protocol), v1.IPFamilyPolicyPreferDualStack),
			want: Request{Families: []Family{IPv6}, Policy: PreferDualStack, Ports: ports},
		},
		{
			name: "PreferDualStack before ipFamilies is defaulted",
			svc:  withPolicy(service(map[string]string{AnnotationIP: "fd00::10"}, ""), v1.IPFamilyPolicyPreferDualStack),
			want: Request{Families: []Family{IPv6, IPv4}, Policy: PreferDualStack, IPs: addrs("fd00::10"), Ports: ports},
		},
		{
			name: "RequireDualStack",
			svc:  withPolicy(service(nil, "", v1.IPv6Protocol, v1.IPv4Protocol), v1.IPFamilyPolicyRequireDualStack),
			want: Request{Families: []Family{IPv6, IPv4}, Policy: RequireDualStack, Ports: ports},
		},
		{
			name:      "RequireDualStack with one family listed",
			svc:       withPolicy(service(nil, "", v1.IPv4Protocol), v1.IPFamilyPolicyRequireDualStack),
			wantField: FieldIPFamilies, wantValue: "[IPv4]", wantSays: "IPv6 is missing",
		},
		{
			name:      "unknown policy",
			svc:       withPolicy(service(nil, ""), "DualStackPlease"),
			wantField: FieldIPFamilyPolicy, wantValue: "DualStackPlease",
		},
		{name: "bad family", svc: service(nil, "", "IPv5"), wantField: FieldIPFamilies, wantValue: "[IPv5]"},
		{name: "family twice", svc: service(nil, "", v1.IPv4Protocol, v1.IPv4Protocol), wantField: FieldIPFamilies, wantValue: "[IPv4 IPv4]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.svc)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("ParseRequest: %v", err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("ParseRequest =\n %+v\nwant\n %+v", got, tt.want)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want *RequestError", err)
			}
			if re.Field != tt.wantField || re.Value != tt.wantValue {
				t.Errorf("error names %s=%q, want %s=%q", re.Field, re.Value, tt.wantField, tt.wantValue)
			}
			if !strings.Contains(err.Error(), tt.wantField) || !strings.Contains(err.Error(), tt.wantSays) {
				t.Errorf("message %q does not name %s or say %q", err, tt.wantField, tt.wantSays)
			}
		})
	}
}

func TestParseRequestNil(t *testing.T) {
	if _, err := ParseRequest(nil); err == nil {
		t.Fatal("ParseRequest(nil) succeeded")
	}
}

// FuzzParseRequest checks that no input panics, that a parsed request
// holds only usable addresses, and that writing it back as annotations
// parses to the same request.
func FuzzParseRequest(f *testing.F) {
	f.Add("192.168.50.10", "lan", "web", "", "IPv4", "")
	f.Add("fd00::1, 10.0.0.1", "", "", "", "IPv6,IPv4", "RequireDualStack")
	f.Add("", "", "", "10.0.0.3", "", "PreferDualStack")
	f.Add("fd00::1", "", "", "", "IPv4", "RequireDualStack")
	f.Add("10.0.0.1,", "a b", "k\x00", "x", "IPv5", "SingleStack")
	f.Add("::ffff:1.2.3.4", "", "", "fe80::1%eth0", "IPv4,IPv4", "Maybe")
	f.Fuzz(func(t *testing.T, ip, pool, key, lbIP, fams, policy string) {
		var families []v1.IPFamily
		if fams != "" {
			for f := range strings.SplitSeq(fams, ",") {
				families = append(families, v1.IPFamily(f))
			}
		}
		ann := map[string]string{AnnotationIP: ip, AnnotationPool: pool, AnnotationSharingKey: key}
		svc := service(ann, lbIP, families...)
		if policy != "" {
			withPolicy(svc, v1.IPFamilyPolicy(policy))
		}
		req, err := ParseRequest(svc)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not a *RequestError", err)
			}
			return
		}
		if _, err := req.families(); err != nil {
			t.Fatalf("parsed request fails the allocator's check: %v (%+v)", err, req)
		}
		if len(req.Families) == 0 {
			t.Fatalf("no families in %+v", req)
		}
		for _, a := range req.IPs {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() {
				t.Fatalf("unusable address %v in %+v", a, req)
			}
		}
		if strings.TrimSpace(req.Pool) != req.Pool || strings.TrimSpace(req.SharingKey) != req.SharingKey {
			t.Fatalf("untrimmed pool or key in %+v", req)
		}
		var fs []v1.IPFamily
		for _, f := range req.Families {
			fs = append(fs, v1.IPFamily(f))
		}
		if req.Policy == RequireDualStack && len(req.Families) != 2 {
			t.Fatalf("RequireDualStack with families %v", req.Families)
		}
		back := service(req.Annotations(), "", fs...)
		if req.Policy != "" {
			withPolicy(back, v1.IPFamilyPolicy(req.Policy))
		}
		again, err := ParseRequest(back)
		if err != nil {
			t.Fatalf("round trip of %+v: %v", req, err)
		}
		if !reflect.DeepEqual(again, req) {
			t.Fatalf("round trip changed %+v into %+v", req, again)
		}
	})
}

// TestOversizedValuesAreNotEchoed: a 200 kB annotation gives an error of a
// few hundred bytes that still names the field and the value's size.
func TestOversizedValuesAreNotEchoed(t *testing.T) {
	junk := strings.Repeat("x", 200_000)
	withAnn := func(ann map[string]string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}
	}
	disagreeing := withAnn(map[string]string{AnnotationIP: "10.0.0.1"})
	disagreeing.Spec.LoadBalancerIP = junk
	for _, svc := range []*v1.Service{
		withAnn(map[string]string{AnnotationIP: junk}),
		withAnn(map[string]string{AnnotationIP: "10.0.0.1," + junk}),
		withAnn(map[string]string{AnnotationPool: junk}),
		withAnn(map[string]string{AnnotationSharingKey: junk + " "}),
		disagreeing,
	} {
		ann := svc.Annotations
		_, err := ParseRequest(svc)
		if err == nil {
			t.Fatalf("%.40v: no error", ann)
		}
		msg := err.Error()
		if len(msg) > 512 {
			t.Errorf("error of %d bytes: %.80s...", len(msg), msg)
		}
		var re *RequestError
		if !errors.As(err, &re) || !strings.HasPrefix(msg, re.Field+"=") || !strings.Contains(msg, "bytes)") {
			t.Errorf("error does not name the field and the value's size: %.200s", msg)
		}
	}
}

func TestClipKeepsRunesWhole(t *testing.T) {
	s := strings.Repeat("é", 100) // 2 bytes each
	for n := 0; n < 20; n++ {
		got := clip(s, n)
		if len(got) > n || !utf8.ValidString(got) || len(got) < n-1 {
			t.Errorf("clip(é..., %d) = %q", n, got)
		}
	}
}
