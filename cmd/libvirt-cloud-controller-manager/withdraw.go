package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/provider"
)

// withdrawCommand removes from this host what the CCM wrote into its
// kernel (owned routes, the VIPs' neighbour entries). The package's removal
// runs it once the CCM has stopped; nothing else should: a restart keeps
// every answer and route in place.
func withdrawCommand() *cobra.Command {
	var cloudConfig string
	cmd := &cobra.Command{
		Use:   "withdraw",
		Short: "Remove the routes and neighbour entries the CCM owns on this host (run after stopping it for good)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := provider.LoadConfigFile(cloudConfig)
			if err != nil {
				return err
			}
			w, err := provider.Withdraw(cfg)
			fmt.Fprintf(c.OutOrStdout(), "withdrew %d pod-CIDR routes, %d VIP routes, %d neighbour entries\n", w.Routes, w.VIPRoutes, w.Neighbours)
			return err
		},
	}
	cmd.Flags().StringVar(&cloudConfig, "cloud-config", "/etc/libvirt-cloud-controller-manager/cloud-config.yaml", "the cloud config the CCM ran with")
	return cmd
}
