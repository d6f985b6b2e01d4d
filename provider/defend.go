package provider

import (
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lb/announce"
)

// vipDefended tells the Services holding the VIP that another host
// claimed it: it probed for it (IPv6 duplicate-address detection), so its
// address failed, or it announced or used it, so the VIP was announced
// again. Either way whoever configured it there is about to find out the
// hard way. The announcer's reader calls it once l leads, at most once per
// announce.DefendInterval per VIP: it must not block, and the recorder
// does not. The message stays the same from one claim to the next, so
// that the recorder counts repeats in one Event.
func (l *loadBalancer) vipDefended(d announce.Defence) {
	for _, k := range l.alloc.Holders(d.VIP) {
		ns, name, _ := strings.Cut(k, "/")
		svc, err := l.services.Services(ns).Get(name)
		if err != nil {
			continue
		}
		if d.Probe {
			l.recorder.Eventf(svc, v1.EventTypeWarning, ReasonConflict,
				"The host with MAC %s probed for %s on %s (IPv6 duplicate-address detection); the VIP was defended, so that host cannot use it: remove the address there", d.From, d.VIP, l.bridge)
			continue
		}
		l.recorder.Eventf(svc, v1.EventTypeWarning, ReasonConflict,
			"The host with MAC %s claims %s on %s (ARP or Neighbor Discovery); the VIP was announced again, at most once per 10 s: remove the address there", d.From, d.VIP, l.bridge)
	}
}
