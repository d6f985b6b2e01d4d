package provider

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/bgp"
)

// BGPConfig: an embedded BGP speaker that announces every Node's pod
// CIDRs, with the Node's InternalIP as next hop, so that the LAN router
// forwards pod traffic to the right node. Without peers there is no
// speaker.
type BGPConfig struct {
	// ASN is the CCM's own AS number.
	ASN uint32 `json:"asn"`
	// RouterID is the speaker's BGP identifier, an IPv4 address (usually
	// the host's address on the LAN).
	RouterID string          `json:"routerID"`
	Peers    []BGPPeerConfig `json:"peers"`
	// Communities ("ASN:value") are added to every announced route.
	Communities []string `json:"communities"`
	// LocalPreference, when set, is sent to internal (same-AS) peers.
	LocalPreference uint32 `json:"localPreference"`
	// RestartTime is how long peers keep the CCM's routes while it
	// restarts (graceful restart); default 120s, at most 4095s.
	RestartTime metav1.Duration `json:"restartTime"`
	// AnnounceVIPs (routed mode) also announces each LoadBalancer VIP as a
	// host route (/32, /128) via the node that answers it, from the
	// replica on that node's host: the router forwards VIP traffic to the
	// right node when the hosts are not on one L2 segment.
	AnnounceVIPs bool `json:"announceVIPs"`
}

// BGPPeerConfig is one BGP neighbour, usually the LAN router.
type BGPPeerConfig struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// Port is the peer's BGP port (default 179).
	Port uint16 `json:"port"`
	// BFD detects a lost peer in about a second (300 ms × 3); the peer
	// must run BFD too.
	BFD bool `json:"bfd"`
	// PasswordFile holds the TCP MD5 password; the password itself never
	// goes in this file, on a command line or in a log.
	PasswordFile string `json:"passwordFile"`
	// HoldTime of the session (default 90s).
	HoldTime metav1.Duration `json:"holdTime"`
	// EBGPMultihop is the TTL for an external peer that is not on a
	// directly connected network (default 0: directly connected).
	EBGPMultihop uint8 `json:"ebgpMultihop"`
}

// Enabled reports whether a speaker is configured.
func (c BGPConfig) Enabled() bool { return len(c.Peers) > 0 || c.ASN != 0 }

// validate checks everything but the password files, which are read
// when the speaker starts.
func (c BGPConfig) validate() []error {
	if !c.Enabled() {
		return nil
	}
	_, err := c.options(func(string) (string, error) { return "", nil })
	if err == nil {
		return nil
	}
	return []error{err}
}

// SpeakerOptions are the speaker's options, with each peer's password
// read from its file.
func (c BGPConfig) SpeakerOptions() (bgp.Options, error) {
	return c.options(readPasswordFile)
}

// maxPasswordFile bounds what is read: TCP MD5 keys are at most 80 bytes.
const maxPasswordFile = 4096

// readPasswordFile reads a password as ssh reads a private key: refused
// when group or others may read or write the file, or when it belongs to
// a user other than root or this process's, who could swap it.
func readPasswordFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("is not a regular file")
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("has mode %04o: group or others may read or write it (chmod 600 it)", perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("is owned by uid %d, neither root nor the CCM's user (chown it)", st.Uid)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxPasswordFile {
		return "", fmt.Errorf("is longer than %d bytes", maxPasswordFile)
	}
	pw := strings.TrimRight(string(data), "\r\n")
	if pw == "" {
		return "", errors.New("is empty")
	}
	return pw, nil
}

func (c BGPConfig) options(readPassword func(string) (string, error)) (bgp.Options, error) {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("bgp.%s: %q %s", field, fmt.Sprint(value), why))
	}
	o := bgp.Options{ASN: c.ASN, LocalPreference: c.LocalPreference, RestartTime: c.RestartTime.Duration}
	if c.RouterID != "" {
		id, err := netip.ParseAddr(c.RouterID)
		if err != nil {
			bad("routerID", c.RouterID, "is not an IPv4 address")
		}
		o.RouterID = id
	}
	for i, s := range c.Communities {
		v, err := parseCommunity(s)
		if err != nil {
			bad(fmt.Sprintf("communities[%d]", i), s, err.Error())
		}
		o.Communities = append(o.Communities, v)
	}
	for i, p := range c.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		addr, err := netip.ParseAddr(p.Address)
		if err != nil {
			bad(field+".address", p.Address, "is not an IP address")
		}
		peer := bgp.Peer{Address: addr.Unmap(), ASN: p.ASN, Port: p.Port, BFD: p.BFD, HoldTime: p.HoldTime.Duration, EBGPMultihop: p.EBGPMultihop}
		if p.PasswordFile != "" {
			if peer.Password, err = readPassword(p.PasswordFile); err != nil {
				bad(field+".passwordFile", p.PasswordFile, err.Error())
			}
		}
		o.Peers = append(o.Peers, peer)
	}
	if len(errs) == 0 {
		if err := o.Validate(); err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				errs = append(errs, errors.New("bgp."+line))
			}
		}
	}
	return o, errors.Join(errs...)
}

// parseCommunity reads a standard community, "ASN:value" (each 0..65535).
func parseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(s, ":")
	a, errA := strconv.ParseUint(hi, 10, 16)
	b, errB := strconv.ParseUint(lo, 10, 16)
	if !ok || errA != nil || errB != nil {
		return 0, errors.New(`is not "ASN:value" with each part 0..65535`)
	}
	return uint32(a)<<16 | uint32(b), nil
}
