package provider

import (
	"net"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// vipDefended tells the Services holding vip that the host with MAC from
// probed for it (IPv6 duplicate-address detection): the announcer
// defended the VIP, so that host's address failed, but whoever configured
// it there is about to find out the hard way. The announcer's reader
// calls it once l leads: it must not block, and the recorder does not.
func (l *loadBalancer) vipDefended(vip netip.Addr, from net.HardwareAddr) {
	services := l.place.services
	for _, k := range l.alloc.Holders(vip) {
		ns, name, _ := strings.Cut(k, "/")
		svc, err := services.Services(ns).Get(name)
		if err != nil {
			continue
		}
		l.recorder.Eventf(svc, v1.EventTypeWarning, ReasonConflict,
			"The host with MAC %s probed for %s on %s (IPv6 duplicate-address detection); the VIP was defended, so that host cannot use it: remove the address there", from, vip, l.bridge)
	}
}
