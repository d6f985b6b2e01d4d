package provider

import (
	"errors"
	"fmt"
)

// CheckDataPath reports whether the parts that write this host's kernel
// work: the VIP announcer runs (when load balancers are on) and the routes'
// bridge can be read (when routes are on). The CCM's /healthz and its
// systemd watchdog ask it, so a CCM that cannot answer VIPs or write routes
// is seen as unhealthy rather than reporting ok.
func (c *Cloud) CheckDataPath() error {
	var errs []error
	if c.lb != nil {
		errs = append(errs, c.lb.checkAnnouncer())
	}
	if c.routes != nil {
		if _, err := c.routes.table.Subnets(); err != nil {
			errs = append(errs, fmt.Errorf("routes on bridge %s: %w", c.routes.bridge, err))
		}
	}
	return errors.Join(errs...)
}
