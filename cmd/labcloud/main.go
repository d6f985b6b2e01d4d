// Command labcloud runs the simulated cloud: `labcloud up` brings up a
// control plane, a libvirt network, small VMs as nodes and the libvirt CCM
// in a network namespace of its own; `labcloud down` removes all of it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/kubeletsim"
	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/lab/relay"
	"github.com/labcloud/labcloud/lab/up"
	"github.com/labcloud/labcloud/version"
)

// insideEnv marks the copy of labcloud re-executed inside the namespace.
const insideEnv = "LABCLOUD_INSIDE_NETNS"

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := root().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "labcloud:", err)
		if errors.Is(err, up.ErrRestoreFailed) {
			os.Exit(restoreFailedExit)
		}
		os.Exit(1)
	}
}

func root() *cobra.Command {
	dir := lab.DefaultStateDir
	cmd := &cobra.Command{
		Use:           "labcloud",
		Short:         "A simulated cloud for the libvirt cloud-controller-manager",
		Version:       version.Get(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return &lab.FlagError{Flag: "--state-dir", Value: `""`, Reason: "must name a directory"}
			}
			return nil
		},
	}
	cmd.SetVersionTemplate("labcloud {{.Version}}\n")
	cmd.PersistentFlags().StringVar(&dir, "state-dir", dir, "where the running lab keeps its files")
	cmd.AddCommand(upCmd(&dir), downCmd(&dir), statusCmd(&dir), execCmd(&dir), routerCmd(&dir), nodeCmd(&dir), benchCmd(&dir), chaosCmd(&dir), e2eCmd(&dir),
		logsCmd(&dir), exportCmd(&dir), kubeconfigCmd(&dir), versionCmd(&dir), simulateCmd(), forwardCmd())
	cmd.AddCommand(loadCmd(&dir), registryCmd(), snapshotCmd())
	return cmd
}

func requireRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespace, libvirtd, QEMU): run with sudo")
	}
	return nil
}

// inNetns runs this program again inside the lab's namespace with args.
// rootLabState is the running lab's state, for a command that acts on it
// as root.
func rootLabState(dir string) (*lab.State, error) {
	if err := requireRoot(); err != nil {
		return nil, err
	}
	return lab.LoadState(dir)
}

func inNetns(ctx context.Context, args ...string) error { return inNetnsWith(ctx, nil, args...) }

// inNetnsWith is inNetns handing files down as descriptors 3, 4, ...
func inNetnsWith(ctx context.Context, files []*os.File, args ...string) error {
	if os.Getenv(insideEnv) != "" {
		return errors.New("already inside the lab namespace")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Netns, self}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), insideEnv+"=1")
	return cmd.Run()
}

func upCmd(dir *string) *cobra.Command {
	opts := lab.Options{Nodes: 3}
	var (
		keep        bool
		failureLogs string
		waitFor     time.Duration
		listenerFD  int
		ipFamily    = string(lab.IPv4)
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Bring the lab up: namespace, libvirtd, network, control plane, CCM, N guests",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Every flag is checked before anything is made.
			if cmd.Flags().Changed("wait") && waitFor <= 0 {
				return &lab.FlagError{Flag: "--wait", Value: waitFor.String(), Reason: "must be positive"}
			}
			if cmd.Flags().Changed("logs-on-failure") {
				if err := outputDir("--logs-on-failure", failureLogs); err != nil {
					return err
				}
				failureLogs, _ = filepath.Abs(failureLogs) // outputDir made sure it can be
			}
			opts.Wait, opts.Dir, opts.Out = waitFor, *dir, cmd.OutOrStdout()
			fam, err := lab.ParseIPFamily(ipFamily)
			if err != nil {
				return err
			}
			opts.IPFamily = fam
			if opts.CloudConfig != "" {
				abs, err := filepath.Abs(opts.CloudConfig)
				if err != nil {
					return &lab.FlagError{Flag: "--cloud-config", Value: opts.CloudConfig, Reason: err.Error()}
				}
				opts.CloudConfig = abs
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			if bin, ok := up.FindCCMBinary(); ok {
				if err := lab.ParseCCMFlags(cmd.Context(), bin, opts.CCMFlags); err != nil {
					return err
				}
			}
			if listenerFD != 0 && listenerFD < 3 {
				return &lab.FlagError{Flag: "--host-listener-fd", Value: fmt.Sprint(listenerFD), Reason: "want a descriptor from 3 up"}
			}
			if err := requireRoot(); err != nil {
				return err
			}
			if os.Getenv(insideEnv) != "" {
				if listenerFD > 0 {
					syscall.CloseOnExec(listenerFD) // for the forwarder only, not every daemon up starts
					opts.HostListener = os.NewFile(uintptr(listenerFD), "host-listener")
				}
				var err error
				if opts.Light {
					_, err = up.Light(cmd.Context(), opts)
				} else {
					_, err = up.Full(cmd.Context(), opts)
				}
				return err
			}
			if _, err := lab.LoadState(*dir); err == nil {
				return fmt.Errorf("a lab is already up (state in %s); run labcloud down first", *dir)
			}
			if !opts.Light { // a light lab runs neither libvirtd nor QEMU
				if err := ensureHostPackages(cmd); err != nil {
					return err
				}
			}
			if err := makeNamespaces(cmd, opts); err != nil {
				return err
			}
			err = upInNetns(cmd, *dir, opts)
			if exitCode(err) == restoreFailedExit {
				// The snapshot is gone: what the restore made goes, and
				// the lab boots.
				w := cmd.ErrOrStderr()
				exportFailedUp(cmd.Context(), w, *dir, failureLogs)
				fmt.Fprintln(w, "labcloud up: the restore failed; removing what it made, then booting the lab")
				_ = lab.Down(*dir, w)
				if err := makeNamespaces(cmd, opts); err != nil {
					return err
				}
				opts.Fresh = true
				err = upInNetns(cmd, *dir, opts)
			}
			if err != nil {
				afterFailedUp(cmd.Context(), cmd.ErrOrStderr(), *dir, failureLogs, keep)
				return fmt.Errorf("up: %w", err)
			}
			// Here, in the host's namespace, the forwarder is checked end to end.
			st, err := lab.LoadState(*dir)
			if err == nil {
				err = up.CheckHostAPIServer(cmd.Context(), st)
			}
			if err != nil {
				afterFailedUp(cmd.Context(), cmd.ErrOrStderr(), *dir, failureLogs, keep)
				return fmt.Errorf("up: %w", err)
			}
			if !opts.Light { // a light up ends with a status summary of its own
				if err := inNetns(cmd.Context(), "status", "--state-dir", *dir); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nFrom the host: export KUBECONFIG=%s (labcloud kubeconfig prints it)\n"+
				"Inside the lab's namespace: labcloud exec -- CMD (kubectl on its PATH); logs: labcloud logs\n", st.HostKubeconfig)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Nodes, "nodes", opts.Nodes, fmt.Sprintf("number of nodes: guest VMs (1-%d), or simulated nodes with --light (1-%d)", lab.MaxNodes, lab.MaxLightNodes))
	f.IntVar(&opts.Hosts, "hosts", 1, fmt.Sprintf("number of hypervisor hosts (1-%d): each a namespace with its own libvirtd, bridge and CCM replica, the bridges on one LAN with the FRR router; guests spread round robin (full lab, not with --cloud-config)", lab.MaxHosts))
	f.BoolVar(&opts.Routed, "routed", false, "with --hosts: each host on a segment of its own, routed by the router, VIPs announced over BGP (IPv4)")
	f.BoolVar(&opts.Fresh, "fresh", false, "boot even when a snapshot of a lab of this shape is stored (labcloud snapshot list); the boot's snapshot replaces it")
	f.BoolVar(&opts.NoSnapshot, "no-snapshot", false, "take no snapshot of the booted lab for the next up to restore")
	f.BoolVar(&keep, "keep-on-failure", keep, "leave a failed lab in place for inspection")
	f.StringVar(&failureLogs, "logs-on-failure", "", "where a failed up writes its logs export (default: a new directory labcloud-up-failed-* under $TMPDIR or /tmp)")
	f.BoolVar(&opts.Light, "light", opts.Light, "no guests and no libvirtd: libvirt's test driver and simulated nodes")
	f.StringArrayVar(&opts.InsecureRegistries, "insecure-registry", nil, "a registry (HOST[:PORT]) the nodes pull from over plain HTTP, after the lab's own registry (repeatable; full lab)")
	f.StringVar(&opts.Subnet, "subnet", "", fmt.Sprintf("the lab's IPv4 network, a /24 (default %s): the bridge .1, DHCP .100-.199, VIPs .200-.250, router .254; with --routed the other hosts' segments A.B.K.0/24, the LAN A.B.250.0/24 and the VIPs A.B.240.0/26 move with it (full lab; the IPv6 prefixes and the Service CIDR %s are fixed)", lab.DefaultSubnet, lab.ServiceCIDR))
	f.StringVar(&opts.PodCIDR, "pod-cidr", "", fmt.Sprintf("the cluster's IPv4 pod range, a /8 to /16 (default %s), a /24 per node (full lab; the IPv6 one is fixed)", lab.DefaultPodCIDR))
	f.StringVar(&ipFamily, "ip-family", ipFamily, "the cluster's IP family: ipv4, ipv6 or dual (IPv4 first); ipv6 and dual add an IPv6 /64 with RA and DHCPv6 to the lab's network (full lab only)")
	f.DurationVar(&waitFor, "wait", 0, fmt.Sprintf("how long up waits for every Node to be Ready and initialized (default %s; with --light 3m plus 100ms per node)", lab.DefaultWait))
	f.StringArrayVar(&opts.CCMFlags, "ccm-flag", nil, "a flag added to the CCM's shipped command line, one word each (repeatable), e.g. --ccm-flag=--v=4")
	f.StringVar(&opts.CloudConfig, "cloud-config", "", "a cloud-config file for the CCM instead of the lab's (full lab; must name the lab's libvirtd, network and bridge; docs/lab.md)")
	f.IntVar(&listenerFD, "host-listener-fd", 0, "descriptor of the host listener the forwarder serves (set by up itself)")
	_ = f.MarkHidden("host-listener-fd")
	return cmd
}

// afterFailedUp writes the logs export of a failed up into logsDir (a new
// temporary directory when "") and, unless keep, removes what up made. It
// makeNamespaces makes the lab's namespaces once no other lab or e2e run
// holds the host. A namespace of that name belongs to a lab that is up (it
// holds the host lock) or is a leftover of a crashed run: the lock comes
// first. The namespaces are made here, in the host's mount namespace: one
// made inside the lab's namespace (ip netns exec gives up a mount
// namespace of its own) would have no name anywhere else.
func makeNamespaces(cmd *cobra.Command, opts lab.Options) error {
	release, err := libvirtd.Lock(cmd.Context(), func() {
		fmt.Fprintln(cmd.ErrOrStderr(), "waiting for an e2e run or another lab to release the host")
	})
	if err != nil {
		return err
	}
	defer release()
	return lab.MakeNamespaces(opts)
}

// upInNetns runs up inside the lab's namespace, made before.
func upInNetns(cmd *cobra.Command, dir string, opts lab.Options) error {
	// The API server's port on the host's loopback: made here, in
	// the host's namespace, and served from the lab's.
	hostListener, err := relay.ListenHost()
	if err != nil {
		return err
	}
	args := []string{"up", "--nodes", fmt.Sprint(opts.Nodes), "--hosts", fmt.Sprint(opts.Hosts), "--state-dir", dir, "--host-listener-fd=3", "--ip-family", string(opts.IPFamily),
		fmt.Sprintf("--light=%t", opts.Light), fmt.Sprintf("--routed=%t", opts.Routed),
		fmt.Sprintf("--fresh=%t", opts.Fresh), fmt.Sprintf("--no-snapshot=%t", opts.NoSnapshot)}
	if opts.Wait > 0 {
		args = append(args, "--wait", opts.Wait.String())
	}
	for _, f := range opts.CCMFlags {
		args = append(args, "--ccm-flag="+f)
	}
	if opts.CloudConfig != "" {
		args = append(args, "--cloud-config", opts.CloudConfig)
	}
	for _, r := range opts.InsecureRegistries {
		args = append(args, "--insecure-registry="+r)
	}
	if opts.Subnet != "" {
		args = append(args, "--subnet", opts.Subnet)
	}
	if opts.PodCIDR != "" {
		args = append(args, "--pod-cidr", opts.PodCIDR)
	}
	err = inNetnsWith(cmd.Context(), []*os.File{hostListener}, args...)
	hostListener.Close()
	return err
}

// restoreFailedExit is the exit status of an up inside the namespace
// whose restore failed: the snapshot is removed, and the outer up boots.
const restoreFailedExit = 75

// exitCode is the exit status of a command that ended with err, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// says on w what it did; up's own error is the caller's to return.
func afterFailedUp(ctx context.Context, w io.Writer, stateDir, logsDir string, keep bool) {
	exportFailedUp(ctx, w, stateDir, logsDir)
	if !keep {
		fmt.Fprintln(w, "labcloud up failed; removing what it made (use --keep-on-failure to inspect)")
		_ = lab.Down(stateDir, w)
	}
}

// failedUpExportTimeout bounds the export of a failed up: an API server
// that hangs must not hold up the teardown for long.
const failedUpExportTimeout = 2 * time.Minute

// exportFailedUp exports what the failed up left, naming the directory
// before it starts so that even an export cut short is found, or says why
// there is nothing to export.
func exportFailedUp(ctx context.Context, w io.Writer, stateDir, logsDir string) {
	// An up cut short by a signal still leaves its logs: the export
	// outlives ctx, for a bounded time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedUpExportTimeout)
	defer cancel()
	st, err := lab.LoadState(stateDir)
	if err != nil {
		fmt.Fprintf(w, "no logs of the failed up to export: %v\n", err)
		return
	}
	out, err := makeLogsDir(logsDir, "labcloud-up-failed-")
	if err != nil {
		fmt.Fprintf(w, "could not export the logs of the failed up: %v\n", err)
		return
	}
	fmt.Fprintf(w, "logs of the failed up: %s\n", out)
	if err := exportLogs(ctx, stateDir, st, out); err != nil {
		fmt.Fprintf(w, "logs of the failed up: %v\n", err)
	}
}

// simulateCmd is the light lab's simulated kubelets; `up --light` starts it
// as a daemon inside the lab's namespace.
func simulateCmd() *cobra.Command {
	var (
		kubeconfig string
		opts       kubeletsim.SimOptions
	)
	cmd := &cobra.Command{
		Use:    "simulate",
		Short:  "Register and heartbeat the light lab's simulated nodes (started by up --light)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(positive("--nodes", opts.Nodes), positiveDuration("--heartbeat", opts.Heartbeat), existingFile("--kubeconfig", kubeconfig)); err != nil {
				return err
			}
			client, err := kubeletsim.SimClient(kubeconfig)
			if err != nil {
				return err
			}
			opts.Client = client
			opts.Identity = func(i int) (string, string) { return lab.LightNode(i, opts.Nodes) }
			return kubeletsim.Simulate(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "the simulator's kubeconfig")
	cmd.Flags().IntVar(&opts.Nodes, "nodes", 0, "number of simulated nodes")
	cmd.Flags().DurationVar(&opts.Heartbeat, "heartbeat", 0, "how often each node's Lease is renewed")
	return cmd
}

// ensureHostPackages installs libvirt, QEMU and friends when missing, with
// the checkout's hack/install-deps.sh.
func ensureHostPackages(cmd *cobra.Command) error {
	missing := false
	for _, b := range []string{"libvirtd", "virtlogd", "qemu-system-x86_64", "dnsmasq", "busybox", "dhcpcd"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	script := filepath.Join("hack", "install-deps.sh")
	if _, err := os.Stat(script); err != nil {
		return errors.New("libvirt/QEMU are not installed: run hack/install-deps.sh from a labcloud checkout")
	}
	fmt.Fprintln(cmd.OutOrStdout(), "installing host packages (hack/install-deps.sh) ...")
	c := exec.CommandContext(cmd.Context(), script)
	c.Stdout, c.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	return c.Run()
}

func downCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove everything the lab made (safe to run twice)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireRoot(); err != nil {
				return err
			}
			return lab.Down(*dir, cmd.OutOrStdout())
		},
	}
}

func statusCmd(dir *string) *cobra.Command {
	output := "table"
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Nodes, domains, addresses, pod CIDRs, routes; Services, VIPs, answering nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return &lab.FlagError{Flag: "--output", Value: output, Reason: "want table or json"}
			}
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			if os.Getenv(insideEnv) == "" {
				return inNetns(cmd.Context(), "status", "--state-dir", *dir, "--output", output)
			}
			s, err := lab.GetStatus(cmd.Context(), st)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(s)
			}
			s.WriteTable(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "table or json")
	return cmd
}

func execCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "exec -- CMD [ARGS...]",
		Short: "Run a command inside the lab's network namespace (kubectl on PATH)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			c := exec.CommandContext(cmd.Context(), "ip", append([]string{"netns", "exec", lab.Netns}, args...)...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
			c.Env = append(os.Environ(), "PATH="+st.Tools+":"+os.Getenv("PATH"), "KUBECONFIG="+st.Kubeconfig)
			if err := c.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					os.Exit(ee.ExitCode())
				}
				return err
			}
			return nil
		},
	}
}

func routerCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:     "router -- VTYSH-COMMAND...",
		Short:   "Run a vtysh command on the lab's LAN router (FRR), e.g. show ip route bgp",
		Example: "  labcloud router -- show bgp summary\n  labcloud router -- show ip route bgp",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			out, err := lab.RouterCommand(cmd.Context(), st, strings.Join(args, " "))
			fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
}

func nodeCmd(dir *string) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Act on a lab node's domain"}
	for _, action := range []string{"stop", "start", "delete"} {
		cmd.AddCommand(&cobra.Command{
			Use:               action + " NAME",
			Short:             action + " the node's domain",
			Args:              cobra.ExactArgs(1),
			ValidArgsFunction: completeNodes(dir),
			RunE: func(_ *cobra.Command, args []string) error {
				st, err := lab.LoadState(*dir)
				if err != nil {
					return err
				}
				if st.Light {
					return fmt.Errorf("node %s: the light lab's nodes are libvirt test-driver domains inside its CCM; node %s acts on the full lab's guests", action, action)
				}
				if !slices.Contains(st.Nodes, args[0]) {
					return fmt.Errorf("node %s %q: not a node of this lab (%s)", action, args[0], strings.Join(st.Nodes, ", "))
				}
				return lab.NodeAction(st, args[0], action)
			},
		})
	}
	return cmd
}
