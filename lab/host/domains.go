package host

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// Domain is a libvirt domain as the lab sees it: its state, and the MAC of
// its NIC on the lab's network.
type Domain struct {
	State   string // running, shut-off, crashed, paused, shutting-down
	Running bool
	MAC     string
}

var stateNames = map[libvirt.DomainState]string{
	libvirt.DOMAIN_RUNNING: "running", libvirt.DOMAIN_SHUTOFF: "shut-off", libvirt.DOMAIN_CRASHED: "crashed",
	libvirt.DOMAIN_PAUSED: "paused", libvirt.DOMAIN_SHUTDOWN: "shutting-down",
}

// Domains reads the domains on uri whose names start with prefix, over a
// read-only connection, with the MAC of each one's NIC on network.
func Domains(uri, network, prefix string) (map[string]Domain, error) {
	c, err := libvirt.NewConnectReadOnly(uri)
	if err != nil {
		return nil, fmt.Errorf("libvirt %s: %w", uri, err)
	}
	defer c.Close()
	doms, err := c.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	out := map[string]Domain{}
	for _, d := range doms {
		name, err := d.GetName()
		if err == nil && strings.HasPrefix(name, prefix) {
			state, _, _ := d.GetState()
			dom := Domain{State: stateNames[state], Running: state == libvirt.DOMAIN_RUNNING}
			if desc, err := d.GetXMLDesc(0); err == nil {
				dom.MAC = NetworkMAC(desc, network)
			}
			out[name] = dom
		}
		d.Free()
	}
	return out, nil
}

// NetworkMAC is the MAC of the domain's NIC on network; empty if it has
// none there.
func NetworkMAC(domainXML, network string) string {
	var x libvirtxml.Domain
	if x.Unmarshal(domainXML) != nil || x.Devices == nil {
		return ""
	}
	for _, i := range x.Devices.Interfaces {
		if i.MAC != nil && i.Source != nil && i.Source.Network != nil && i.Source.Network.Network == network {
			return strings.ToLower(i.MAC.Address)
		}
	}
	return ""
}

// StartDomain starts the defined domain name on uri.
func StartDomain(uri, name string) error {
	c, err := libvirt.NewConnect(uri)
	if err != nil {
		return fmt.Errorf("libvirt: %w", err)
	}
	defer c.Close()
	d, err := c.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("domain %s: %w", name, err)
	}
	defer d.Free()
	if err := d.Create(); err != nil {
		return fmt.Errorf("start domain %s: %w", name, err)
	}
	return nil
}

// WaitDomainDown waits until d is no longer active; false after timeout.
func WaitDomainDown(d *libvirt.Domain, timeout time.Duration) bool {
	return wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		active, err := d.IsActive()
		return err == nil && !active, nil
	}) == nil
}
