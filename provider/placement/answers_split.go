package placement

import (
	"bytes"
	"net"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/labcloud/labcloud/lb"
)

// With hypervisors on several hosts, each replica answers on its own
// host's bridge for exactly the VIPs whose node runs on that host: one
// answerer per VIP on the LAN, and no replica speaks for another host.
// The leader still places every VIP. Its own host's announcer gets the
// VIPs of nodes on its host; the Services' Announced conditions, which
// placement writes after every pass, tell the other replicas theirs
// (follow.go). A node's host is where libvirt says its domain
// runs: the zone of the hypervisor holding it.

// answerSplit is every VIP's current answer as the leader's placement
// sees it, split between this host's announcer and the other hosts. The
// pass owns it.
type answerSplit struct {
	ann Announcer
	// here says which hypervisor zones are on this host; nil with
	// hypervisors on one host, where every VIP is answered here.
	here map[string]bool
	// elsewhere is each VIP answered on another host, by its node's MAC.
	// No VIP is both here (owned by ann) and elsewhere.
	elsewhere map[netip.Addr]net.HardwareAddr
	seeded    bool
}

func newAnswerSplit(ann Announcer, here map[string]bool) *answerSplit {
	return &answerSplit{ann: ann, here: here, elsewhere: map[netip.Addr]net.HardwareAddr{}}
}

// isHere says whether a node whose domain is in zone answers on this host.
func (s *answerSplit) isHere(zone string) bool { return s.here == nil || s.here[zone] }

// answering is every answered VIP and the MAC answering it, wherever.
func (s *answerSplit) answering() map[netip.Addr]net.HardwareAddr {
	out := s.ann.Answering()
	for ip, mac := range s.elsewhere {
		out[ip] = mac
	}
	return out
}

// set makes mac, the NIC of a domain in zone, answer vip from now on.
func (s *answerSplit) set(vip netip.Addr, mac net.HardwareAddr, zone string, cause time.Time) error {
	if s.isHere(zone) {
		delete(s.elsewhere, vip)
		return s.ann.SetAfter(vip, mac, cause)
	}
	s.elsewhere[vip] = bytes.Clone(mac)
	if _, owned := s.ann.Owned(vip); owned {
		return s.ann.Remove(vip) // the other host answers as soon as it reads the condition
	}
	return nil
}

// keep leaves vip with mac, which answers it now, and puts it on the right
// host if it is not (a domain that migrated; answers seeded from the
// conditions that this host's announcer did not have). repair sets it
// here again, which mends a neighbour entry that failed before.
func (s *answerSplit) keep(vip netip.Addr, mac net.HardwareAddr, zone string, repair bool) error {
	_, owned := s.ann.Owned(vip)
	if owned != s.isHere(zone) || repair && owned {
		return s.set(vip, mac, zone, time.Time{})
	}
	return nil
}

// remove stops answering vip, wherever it was answered.
func (s *answerSplit) remove(vip netip.Addr) error {
	if _, ok := s.elsewhere[vip]; ok {
		delete(s.elsewhere, vip)
		return nil
	}
	return s.ann.Remove(vip)
}

// seed, on the first pass with several hosts, takes the VIPs the Services'
// Announced conditions say other hosts answer, so that a new leader keeps
// each VIP where it is answered instead of placing it afresh.
func (s *answerSplit) seed(services corelisters.ServiceLister, vips map[netip.Addr]vipClaim) {
	if s.seeded || s.here == nil {
		return
	}
	s.seeded = true
	have := s.ann.Answering()
	for ip, claim := range vips {
		if _, ok := have[ip]; ok {
			continue
		}
		if mac := announcedMAC(services, claim.services, ip); mac != nil {
			s.elsewhere[ip] = mac
		}
	}
}

// announcedMAC is the MAC the Announced condition of one of services says
// answers ip; nil if none says.
func announcedMAC(services corelisters.ServiceLister, keys []string, ip netip.Addr) net.HardwareAddr {
	for _, k := range keys {
		ns, name := splitKey(k)
		svc, err := services.Services(ns).Get(name)
		if err != nil {
			continue
		}
		for _, a := range AnnouncedAnswers(svc) {
			if a.VIP == ip && a.MAC != nil {
				return a.MAC
			}
		}
	}
	return nil
}

// AnnouncedAnswers is who the Service's Announced condition says answers
// each of its VIPs; nil if it has none, or none that can be read.
func AnnouncedAnswers(svc *v1.Service) []lb.Answer {
	c := meta.FindStatusCondition(svc.Status.Conditions, lb.ConditionAnnounced)
	if c == nil {
		return nil
	}
	answers, err := lb.ParseAnnounced(*c)
	if err != nil {
		return nil
	}
	return answers
}
