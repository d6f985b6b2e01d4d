package main

// The commands that measure and test a running lab: bench, chaos and e2e.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/bench"
	"github.com/labcloud/labcloud/lab/chaos"
	"github.com/labcloud/labcloud/lab/conformance"
)

func benchCmd(dir *string) *cobra.Command {
	runs, output := 5, "labcloud-bench.json"
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure VIP failover on the running lab from the wire (kill -9 of QEMU and graceful stop) and memory; writes JSON",
		Long: `Measures, on the running lab, for each of --runs failovers of each kind
(crash: kill -9 of the answering node's QEMU; stop: graceful shutdown), in
seconds from the trigger by the host's clock:
  - the libvirt event, seen on the bench's own connection;
  - the first gratuitous ARP naming another node's MAC, seen on the bridge;
  - the neighbour entry for the VIP moved on the answering host, seen through netlink;
  - the first HTTP answer to a client that opens a new connection every 100 ms;
  - the node back Ready and eligible after it is restarted.
Each run starts with every node eligible. Also a new Service's first answer
and the memory of every daemon and guest. Prints p50/p90 and writes JSON.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(positive("--runs", runs), outputFile("--output", output)); err != nil {
				return err
			}
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			if os.Getenv(insideEnv) == "" {
				abs, err := filepath.Abs(output)
				if err != nil {
					return err
				}
				return inNetns(cmd.Context(), "bench", "--state-dir", *dir, "--runs", fmt.Sprint(runs), "--output", abs)
			}
			res, err := bench.Run(cmd.Context(), st, runs, cmd.OutOrStdout())
			if res != nil {
				data, _ := json.MarshalIndent(res, "", "  ")
				if werr := os.WriteFile(output, append(data, '\n'), 0o644); werr != nil && err == nil {
					err = werr
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\nwritten to %s\n", data, output)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&runs, "runs", runs, "failover runs")
	cmd.Flags().StringVar(&output, "output", output, "JSON file to write")
	return cmd
}

func chaosCmd(dir *string) *cobra.Command {
	opts := chaos.Options{Duration: 5 * time.Minute, Seed: 1}
	output := ""
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Inject faults at random (seeded) into the running lab while checking the CCM's invariants; non-zero exit on a violation",
		Long: `chaos stops and kills node domains, SIGKILLs the CCM, restarts libvirtd, flaps and
re-creates the bridge, and creates and deletes LoadBalancer Services, one fault at a time in
an order fixed by --seed, while it checks continuously that every VIP is answered (ARP, from
a LAN client on the bridge) by exactly one MAC of a running, eligible node; that no two
Services hold one IP without sharing a key; that no Node of an existing domain is deleted;
and that the owned routes match the Nodes' pod CIDRs. Each fault kind has a bounded settle
time; a broken invariant beyond it is a violation. It prints each violation with a
timestamp and a summary, and removes the Services it made.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positiveDuration("--duration", opts.Duration); err != nil {
				return err
			}
			if output != "" {
				if err := outputFile("--json", output); err != nil {
					return err
				}
			}
			st, err := rootLabState(*dir)
			if err != nil {
				return err
			}
			if os.Getenv(insideEnv) == "" {
				args := []string{"chaos", "--state-dir", *dir, "--duration", opts.Duration.String(), "--seed", fmt.Sprint(opts.Seed), fmt.Sprintf("--verbose=%t", opts.Verbose), fmt.Sprintf("--check-only=%t", opts.CheckOnly)}
				if output != "" {
					abs, err := filepath.Abs(output)
					if err != nil {
						return err
					}
					args = append(args, "--json", abs)
				}
				return inNetns(cmd.Context(), args...)
			}
			opts.Out = cmd.OutOrStdout()
			sum, err := chaos.Run(cmd.Context(), st, opts)
			if output != "" && sum.Checks > 0 {
				data, _ := json.MarshalIndent(sum, "", "  ")
				if werr := os.WriteFile(output, append(data, '\n'), 0o644); werr != nil {
					err = errors.Join(err, werr)
				}
			}
			return err
		},
	}
	cmd.Flags().DurationVar(&opts.Duration, "duration", opts.Duration, "how long to inject faults (the last one is still recovered from)")
	cmd.Flags().Int64Var(&opts.Seed, "seed", opts.Seed, "seed of the fault sequence: the same seed gives the same faults in the same order")
	cmd.Flags().BoolVar(&opts.Verbose, "verbose", opts.Verbose, "print every broken invariant as it appears and clears, excused or not")
	cmd.Flags().BoolVar(&opts.CheckOnly, "check-only", opts.CheckOnly, "inject nothing: only check the invariants for --duration")
	cmd.Flags().StringVar(&output, "json", output, "also write the summary as JSON to this file")
	return cmd
}

func e2eCmd(dir *string) *cobra.Command {
	opts := conformance.Options{Focus: conformance.DefaultFocus, Skip: conformance.DefaultSkip, ReportDir: "labcloud-e2e", Timeout: conformance.DefaultTimeout,
		Parallel: conformance.DefaultParallel, Isolate: conformance.DefaultIsolate}
	cmd := &cobra.Command{
		Use:   "e2e",
		Short: "Run Kubernetes' own LoadBalancer e2e tests (e2e.test) against the running lab; writes JUnit",
		Long: `e2e runs the e2e.test built with the lab's tools with the lab's admin kubeconfig,
in a client namespace (labcloud-e2e, 10.124.0.2, and fd00:10:124::2 on an IPv6 or dual lab) joined to the lab's namespace by a veth
pair: VIPs, NodePorts, node and pod addresses are reachable there, from an address outside
the nodes' subnet, as the source-IP tests of externalTrafficPolicy Local require.
The tests run in --parallel processes under Ginkgo's runner; those --isolate selects run
first, beside each other only.
It writes junit_01.xml and e2e.log into --junit-dir, prints every selected test with its
outcome and time, and ends with "N passed, N failed, N skipped"; it exits non-zero when a
test fails. The default focus and skip are explained in docs/conformance.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(regexpFlag("--focus", opts.Focus), regexpFlag("--skip", opts.Skip),
				positiveDuration("--timeout", opts.Timeout), outputDir("--junit-dir", opts.ReportDir), positive("--parallel", opts.Parallel), regexpFlag("--isolate", opts.Isolate)); err != nil {
				return err
			}
			st, err := rootLabState(*dir)
			if err != nil {
				return err
			}
			if opts.ReportDir, err = filepath.Abs(opts.ReportDir); err != nil {
				return err
			}
			if !cmd.Flags().Changed("skip") {
				opts.Skip = conformance.SkipFor(st.IPFamily)
			}
			opts.Out = cmd.OutOrStdout()
			_, err = conformance.Run(cmd.Context(), st, opts)
			return err
		},
	}
	cmd.Flags().StringVar(&opts.Focus, "focus", opts.Focus, "regular expression of the tests to run (Ginkgo focus)")
	cmd.Flags().StringVar(&opts.Skip, "skip", opts.Skip, "regular expression of the tests to leave out (Ginkgo skip); the default drops IPv6 and DualStack tests on an IPv4 lab, DualStack on an IPv6 one")
	cmd.Flags().StringVar(&opts.ReportDir, "junit-dir", opts.ReportDir, "directory for junit_01.xml, e2e.log and the tests' output")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", opts.Timeout, "time limit of the whole suite")
	cmd.Flags().IntVar(&opts.Parallel, "parallel", opts.Parallel, "how many e2e.test processes share the tests (Ginkgo's --procs); 1 runs them one after the other")
	cmd.Flags().StringVar(&opts.Isolate, "isolate", opts.Isolate, "regular expression of the selected tests to run first, beside each other only (with --parallel above 1; empty: none); the default is the rolling-update tests, which count dropped requests")
	return cmd
}
