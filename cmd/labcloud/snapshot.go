package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/lab"
)

func snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "List or remove the booted labs up restores instead of booting",
		Long: `up saves a booted lab (its guests' memory, the control plane's state) once it
has answered through a VIP, unless told --fresh; a later up of the same shape restores it.
The snapshots live in ` + lab.Snapshots().Dir + `.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "The stored snapshots: id, age, size, guests and what shaped them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			snaps, err := lab.Snapshots().List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCREATED\tSIZE\tGUESTS\tSHAPE")
			for _, s := range snaps {
				var shape []string
				for _, k := range []string{"nodes", "hosts", "ipFamily", "routed"} {
					if v := s.Key[k]; v != "" {
						shape = append(shape, k+"="+v)
					}
				}
				fmt.Fprintf(tw, "%s\t%s ago\t%.0f MiB\t%d\t%s\n", s.ID, time.Since(s.Created).Round(time.Second), float64(s.Bytes)/(1<<20), len(s.Guests), strings.Join(shape, " "))
			}
			return tw.Flush()
		},
	})
	all := false
	rm := &cobra.Command{
		Use:   "rm ID...",
		Short: "Remove snapshots by id (--all: every one)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireRoot(); err != nil {
				return err
			}
			store := lab.Snapshots()
			if all {
				if len(args) > 0 {
					return &lab.FlagError{Flag: "--all", Value: "true", Reason: "removes every snapshot: name no ID with it"}
				}
				snaps, err := store.List()
				if err != nil {
					return err
				}
				for _, s := range snaps {
					args = append(args, s.ID)
				}
			} else if len(args) == 0 {
				return fmt.Errorf("name the snapshots to remove (labcloud snapshot list), or --all")
			}
			for _, id := range args {
				if err := store.Remove(id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed snapshot %s\n", id)
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&all, "all", false, "remove every snapshot")
	cmd.AddCommand(rm)
	return cmd
}
