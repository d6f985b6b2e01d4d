package lanprobe

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
)

// Resolve sends one ARP request for ip from the client and returns the
// MAC that answers within timeout, nil when none does.
func (c *Client) Resolve(ip netip.Addr, timeout time.Duration) (net.HardwareAddr, error) {
	var cl *arp.Client
	err := c.Do(func() error {
		ifi, err := net.InterfaceByName(Interface)
		if err != nil {
			return err
		}
		cl, err = arp.Dial(ifi) // the socket stays in the client's namespace
		return err
	})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if err := cl.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	mac, err := cl.Resolve(ip)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		return nil, nil
	}
	return mac, err
}
