// Package bgp announces routes to BGP peers through an embedded GoBGP
// speaker. It only tells peers: it never programs a kernel (netroutes
// does that), never listens for BGP connections (so it needs no
// privileged port), keeps and passes on no route a peer sends (its
// policy accepts only its own), and holds at most maxPrefixes of each
// peer's per family. With BFD on a peer, GoBGP listens on UDP 3784 of
// every address (it can bind to a device, not an address) and drops
// packets from addresses that are not BFD peers; a host firewall should
// let 3784 in only from the peers, with TTL 255.
package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Options configure one speaker.
type Options struct {
	// ASN is the speaker's own AS number.
	ASN uint32
	// RouterID is the speaker's BGP identifier (an IPv4 address, also on
	// IPv6-only hosts: BGP requires it).
	RouterID netip.Addr
	Peers    []Peer
	// Communities are added to every announced route (RFC 1997, each
	// value ASN<<16 | value).
	Communities []uint32
	// LocalPreference, when not zero, is sent on routes to internal peers.
	LocalPreference uint32
	// RestartTime is how long peers keep this speaker's routes after it
	// stops gracefully or dies (graceful restart); zero means 120 s.
	RestartTime time.Duration
}

// Peer is one BGP neighbour the speaker connects to.
type Peer struct {
	Address netip.Addr
	ASN     uint32
	// Port is the peer's BGP port; zero means 179.
	Port uint16
	// Password enables TCP MD5 signatures (RFC 2385). It is never logged.
	Password string
	// BFD enables Bidirectional Forwarding Detection (300 ms × 3).
	BFD bool
	// HoldTime of the session; zero means 90 s.
	HoldTime time.Duration
	// EBGPMultihop, when not zero, is the TTL for an external peer that
	// is not on a directly connected network.
	EBGPMultihop uint8
}

// BFD timers: a peer that stops answering is declared down after
// bfdDetectMultiplier intervals of bfdInterval.
const (
	bfdInterval         = 300 * time.Millisecond
	bfdDetectMultiplier = 3
)

// DefaultRestartTime is the graceful-restart time when Options leave it zero.
const DefaultRestartTime = 120 * time.Second

// Validate names the first problem of each wrong field.
func (o Options) Validate() error {
	var errs []error
	if o.ASN == 0 {
		errs = append(errs, errors.New("asn: required"))
	}
	if !o.RouterID.Is4() || o.RouterID.IsUnspecified() {
		errs = append(errs, fmt.Errorf("routerID: %q must be an IPv4 address (BGP identifiers are 32 bits)", o.RouterID))
	}
	if len(o.Peers) == 0 {
		errs = append(errs, errors.New("peers: at least one peer is required"))
	}
	seen := map[netip.Addr]int{}
	for i, p := range o.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		if !p.Address.IsValid() || p.Address.IsUnspecified() {
			errs = append(errs, fmt.Errorf("%s.address: %q is not a peer address", field, p.Address))
		}
		if j, dup := seen[p.Address]; dup {
			errs = append(errs, fmt.Errorf("%s.address: %s is also peers[%d]", field, p.Address, j))
		}
		seen[p.Address] = i
		if p.ASN == 0 {
			errs = append(errs, fmt.Errorf("%s.asn: required", field))
		}
		if p.HoldTime != 0 && (p.HoldTime < 3*time.Second || p.HoldTime > 65535*time.Second) {
			errs = append(errs, fmt.Errorf("%s.holdTime: %s must be 0 or 3s..65535s (RFC 4271)", field, p.HoldTime))
		}
	}
	if o.RestartTime < 0 || o.RestartTime > 4095*time.Second {
		errs = append(errs, fmt.Errorf("restartTime: %s must be 0..4095s (RFC 4724)", o.RestartTime))
	}
	return errors.Join(errs...)
}
