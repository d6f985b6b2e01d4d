package placement

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
)

// answerer is the one writer of what this host's announcer answers, in
// one of two modes. Until this replica leads it follows: answerOnly answers
// exactly what the follower reads in the Services' Announced conditions
// (follow.go). lead switches it, for good, to the leader's passes: set,
// keep and remove, with every VIP's answer split between this host's
// announcer and the other hosts. Each write holds mu and checks the mode,
// so a follower's write after lead is dropped, a leader's before lead
// fails, and no two interleave, whatever order the loops start or stop
// in.
//
// With hypervisors on several hosts, each replica answers on its own
// host's bridge for exactly the VIPs whose node runs on that host: one
// answerer per VIP on the LAN, and no replica speaks for another host.
// The leader still places every VIP. Its own host's announcer gets the
// VIPs of nodes on its host; the Services' Announced conditions, which
// placement writes after every pass, tell the other replicas theirs. A
// node's host is where libvirt says its domain runs: the zone of the
// hypervisor holding it.
type answerer struct {
	ann Announcer
	// here says which hypervisor zones are on this host; nil with
	// hypervisors on one host, where every VIP is answered here.
	here map[string]bool

	mu      sync.Mutex
	leading bool
	// elsewhere is each VIP answered on another host, by its node's MAC,
	// while leading. No VIP is both here (owned by ann) and elsewhere.
	elsewhere map[netip.Addr]net.HardwareAddr
	seeded    bool
}

// errNotLeading is a leader's write before lead.
var errNotLeading = errors.New("placement does not lead: the follower answers")

func newAnswerer(ann Announcer, here map[string]bool) *answerer {
	return &answerer{ann: ann, here: here, elsewhere: map[netip.Addr]net.HardwareAddr{}}
}

// lead ends following: from its return on, only the leader's writes land.
func (s *answerer) lead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leading = true
}

// follow runs a follower's write unless this replica leads; it says
// whether it did.
func (s *answerer) follow(write func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leading {
		return false
	}
	write()
	return true
}

// answerOnly makes the announcer answer exactly want, while following.
func (s *answerer) answerOnly(ctx context.Context, want map[netip.Addr]net.HardwareAddr) {
	s.follow(func() {
		log := klog.FromContext(ctx)
		have := s.ann.Answering()
		for ip := range have {
			if _, ok := want[ip]; ok {
				continue
			}
			if err := s.ann.Remove(ip); err != nil {
				log.Error(err, "Cannot stop answering a VIP that no node on this host answers now", "ip", ip)
				continue
			}
			log.Info("Stopped answering a VIP: no node on this host answers it now", "ip", ip)
		}
		for ip, mac := range want {
			if bytes.Equal(have[ip], mac) {
				continue
			}
			if err := s.ann.SetAfter(ip, mac, time.Time{}); err != nil {
				log.Error(err, "Answering VIP for a node on this host", "ip", ip, "mac", mac)
				continue
			}
			log.Info("Answering VIP for a node on this host", "ip", ip, "mac", mac)
		}
	})
}

// isHere says whether a node whose domain is in zone answers on this host.
func (s *answerer) isHere(zone string) bool { return s.here == nil || s.here[zone] }

// answering is every answered VIP and the MAC answering it, wherever.
func (s *answerer) answering() map[netip.Addr]net.HardwareAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.ann.Answering()
	for ip, mac := range s.elsewhere {
		out[ip] = mac
	}
	return out
}

// set makes mac, the NIC of a domain in zone, answer vip from now on.
func (s *answerer) set(vip netip.Addr, mac net.HardwareAddr, zone string, cause time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setLocked(vip, mac, zone, cause)
}

func (s *answerer) setLocked(vip netip.Addr, mac net.HardwareAddr, zone string, cause time.Time) error {
	if !s.leading {
		return errNotLeading
	}
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
func (s *answerer) keep(vip netip.Addr, mac net.HardwareAddr, zone string, repair bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, owned := s.ann.Owned(vip)
	if owned != s.isHere(zone) || repair && owned {
		return s.setLocked(vip, mac, zone, time.Time{})
	}
	return nil
}

// remove stops answering vip, wherever it was answered.
func (s *answerer) remove(vip netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leading {
		return errNotLeading
	}
	if _, ok := s.elsewhere[vip]; ok {
		delete(s.elsewhere, vip)
		return nil
	}
	return s.ann.Remove(vip)
}

// seed, on the first pass with several hosts, takes the VIPs the Services'
// Announced conditions say other hosts answer, so that a new leader keeps
// each VIP where it is answered instead of placing it afresh.
func (s *answerer) seed(services corelisters.ServiceLister, vips map[netip.Addr]vipClaim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seeded || s.here == nil || !s.leading {
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
