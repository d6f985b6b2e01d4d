package docs

// Annotation, label and condition keys, and the Service condition's
// reasons and messages, against lb/ and provider/.

import (
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// keyPattern is a prefixed Kubernetes key (annotation, label, taint,
// condition type): "lb.labcloud.io/ip".
var keyPattern = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// labcloudKey finds labcloud's keys in prose (not the metadata namespace URL).
var labcloudKey = regexp.MustCompile(`(?:^|[^/:\w.-])((?:[a-z0-9-]+\.)+labcloud\.io/[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)`)

func TestKeysDocumented(t *testing.T) {
	code := map[string]string{} // key → where
	for _, dir := range []string{"lb", "provider", "provider/placement"} {
		p := parsePkg(t, dir)
		for _, v := range p.consts {
			if keyPattern.MatchString(v) {
				code[v] = dir
			}
		}
		for _, lit := range p.stringLiterals() {
			if keyPattern.MatchString(lit) {
				code[lit] = dir
			}
		}
		// The Service spec fields lb reads besides its annotations.
		for name, v := range p.consts {
			if strings.HasPrefix(name, "Field") {
				code[v] = dir
			}
		}
	}
	if len(code) == 0 {
		t.Fatal("found no annotation, label or condition key in lb/ and provider/")
	}
	ref := readDoc(t, reference)
	refSpans := spanSet(ref)
	for k, dir := range code {
		if !refSpans[k] {
			t.Errorf("%s does not name %s (used in %s/)", reference, k, dir)
		}
	}
	for _, f := range docFiles {
		for _, m := range labcloudKey.FindAllStringSubmatch(readDoc(t, f), -1) {
			if _, ok := code[m[1]]; !ok {
				t.Errorf("%s names %s, which lb/ and provider/ do not define", f, m[1])
			}
		}
	}
	if !strings.Contains(ref, libvirtcloud.MetadataNamespace) {
		t.Errorf("%s does not give the domain metadata namespace %s", reference, libvirtcloud.MetadataNamespace)
	}
}

// TestConditionDocumented: the Service condition's type, reasons and the
// three forms of its message, as lb renders them, are in reference.md's
// Service status section.
func TestConditionDocumented(t *testing.T) {
	sec := section(t, readDoc(t, reference), "Service status")
	have := spanSet(sec)
	p := parsePkg(t, "lb")
	for name, v := range p.consts {
		if strings.HasPrefix(name, "Condition") || strings.HasPrefix(name, "Reason") {
			if !have[v] {
				t.Errorf("%s: Service status does not name %q (lb.%s)", reference, v, name)
			}
		}
	}
	vip := netip.MustParseAddr("10.123.0.200")
	mac, _ := net.ParseMAC("52:54:00:7c:00:01")
	for _, a := range []lb.Answer{{VIP: vip, Node: "lab-node-1", MAC: mac}, {VIP: vip, MAC: mac}, {VIP: vip}} {
		msg := lb.AnnouncedCondition([]lb.Answer{a}).Message
		if !have[msg] {
			t.Errorf("%s: Service status does not show the condition message `%s`", reference, msg)
		}
	}
}
