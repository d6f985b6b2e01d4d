package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/relay"
	"github.com/labcloud/labcloud/version"
)

// The commands kind users reach for: logs, export logs, kubeconfig, version.

func logsCmd(dir *string) *cobra.Command {
	follow := false
	cmd := &cobra.Command{
		Use:   "logs [COMPONENT]",
		Short: "Print a lab component's log (a node name prints its console); without COMPONENT, list them",
		Long: `logs prints the log of one of the lab's processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, ccm (or libvirt-cloud-controller-manager),
libvirtd, virtlogd, simulator (light lab), apiserver-forwarder, or a node's serial
console by node name (kernel, lab-init, containerd, kubelet, kube-proxy). -f keeps
printing what is appended until interrupted. Without COMPONENT it lists the components
and their files.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeLogs(dir),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			if len(args) == 0 {
				if follow {
					return &lab.FlagError{Flag: "-f", Value: "true", Reason: "follows one COMPONENT: name it"}
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "COMPONENT\tLOG\tSIZE")
				for _, s := range lab.LogSources(st) {
					size := "not written yet"
					if fi, err := os.Stat(s.Path); err == nil {
						size = fmt.Sprintf("%d bytes", fi.Size())
					}
					name := s.Component
					if len(s.Aliases) > 0 {
						name += " (" + strings.Join(s.Aliases, ", ") + ")"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", name, s.Path, size)
				}
				return tw.Flush()
			}
			src, err := lab.FindLog(st, args[0])
			if err != nil {
				return err
			}
			return lab.CopyLog(cmd.Context(), src.Path, cmd.OutOrStdout(), follow, 250*time.Millisecond)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", follow, "keep printing what is appended (until Ctrl-C)")
	return cmd
}

func exportCmd(dir *string) *cobra.Command {
	cmd := &cobra.Command{Use: "export", Short: "Export what the lab knows (logs)"}
	cmd.AddCommand(&cobra.Command{
		Use:   "logs [DIR]",
		Short: "Copy every log, the cluster's objects and events, and the lab status into DIR (default: a new temporary directory); prints DIR",
		Long: `export logs writes into DIR: COMPONENT.log for every lab process, nodes/NAME/console.log
and nodes/NAME/qemu.log for each guest, state.json and cloud-config.yaml of the lab,
kubectl-get-nodes-svc-pods.yaml (kubectl get nodes,svc,pods -A -o yaml), events.yaml
and events.txt, and status.json (labcloud status -o json). Kubeconfigs, tokens and keys
are not copied. It copies what it can and exits non-zero naming what it could not.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := ""
			if len(args) == 1 {
				if err := outputDir("DIR", args[0]); err != nil {
					return err
				}
				var err error
				if out, err = filepath.Abs(args[0]); err != nil {
					return err
				}
			}
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			if os.Getenv(insideEnv) != "" {
				return lab.ExportCluster(cmd.Context(), st, out)
			}
			if err := requireRoot(); err != nil {
				return err
			}
			if out, err = makeLogsDir(out, "labcloud-logs-"); err != nil {
				return err
			}
			err = exportLogs(cmd.Context(), *dir, st, out)
			fmt.Fprintln(cmd.OutOrStdout(), out)
			return err
		},
	})
	return cmd
}

// makeLogsDir makes dir for a logs export, or when dir is "" a new
// temporary directory named after pattern, and returns its path.
func makeLogsDir(dir, pattern string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", pattern)
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// exportLogs writes the lab's logs export into out, a directory that
// exists: the files on the host (lab.ExportLogFiles), then the cluster's
// objects, events and status, read from inside the lab's namespace by
// `labcloud export logs` run there. It carries on past a failure and
// returns every one.
func exportLogs(ctx context.Context, stateDir string, st *lab.State, out string) error {
	errs := []error{lab.ExportLogFiles(st, out)}
	// An up that failed before its control plane ran has no cluster to ask.
	if st.Kubeconfig != "" {
		if err := inNetns(ctx, "export", "logs", out, "--state-dir", stateDir); err != nil {
			errs = append(errs, fmt.Errorf("the cluster's objects, events and status: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("export incomplete: %w", err)
	}
	return nil
}

func kubeconfigCmd(dir *string) *cobra.Command {
	internal := false
	cmd := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the lab's admin kubeconfig, which works from the host (API server on the host's loopback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*dir)
			if err != nil {
				return err
			}
			path := st.HostKubeconfig
			if internal {
				path = st.Kubeconfig
			} else if path == "" {
				return errors.New("this lab has no API server on the host's loopback (brought up by an older labcloud?): labcloud kubeconfig --internal prints the one for inside its namespace")
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	cmd.Flags().BoolVar(&internal, "internal", internal, "the kubeconfig for inside the lab's namespace (labcloud exec), with the API server's own address")
	return cmd
}

func versionCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print labcloud's version, its Go and client libraries, and the Kubernetes version of the lab's tools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "labcloud %s\n", version.Get())
			fmt.Fprintf(w, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, m := range bi.Deps {
					if m.Path == "k8s.io/client-go" {
						fmt.Fprintf(w, "client libraries: k8s.io/client-go %s\n", m.Version)
					}
				}
			}
			fmt.Fprintf(w, "lab tools (Kubernetes): %s\n", toolsVersion(cmd.Context(), *dir))
			return nil
		},
	}
}

var toolsDirVersion = regexp.MustCompile(`^k8s-(v[0-9]+\.[0-9]+\.[0-9]+[^-]*)-`)

// toolsVersion says which Kubernetes the lab runs: that of the running
// lab's tools, else of the tools up would use; read from the cache
// directory's name (hack/build-tools.sh keys it by version), else from
// kube-apiserver --version.
func toolsVersion(ctx context.Context, dir string) string {
	tools := ""
	if st, err := lab.LoadState(dir); err == nil && st.Tools != "" {
		tools = st.Tools
	} else if t, err := controlplane.FindTools(); err == nil {
		tools = t
	} else {
		return "not built yet (make tools)"
	}
	if m := toolsDirVersion.FindStringSubmatch(filepath.Base(tools)); m != nil {
		return fmt.Sprintf("%s (%s)", m[1], tools)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(tools, "kube-apiserver"), "--version").Output()
	if err != nil {
		return fmt.Sprintf("unknown (%s: %v)", tools, err)
	}
	return fmt.Sprintf("%s (%s)", strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes "), tools)
}

// forwardCmd is the API server forwarder that up starts as a daemon in the
// lab's namespace with a listening socket of the host's.
func forwardCmd() *cobra.Command {
	var (
		fd int
		to string
	)
	cmd := &cobra.Command{
		Use:    "forward",
		Short:  "Forward connections accepted on an inherited socket to an address (started by up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fd < 3 {
				return &lab.FlagError{Flag: "--listen-fd", Value: fmt.Sprint(fd), Reason: "want an inherited descriptor from 3 up"}
			}
			if _, _, err := net.SplitHostPort(to); err != nil {
				return &lab.FlagError{Flag: "--to", Value: to, Reason: err.Error()}
			}
			l, err := net.FileListener(os.NewFile(uintptr(fd), "listener"))
			if err != nil {
				return fmt.Errorf("--listen-fd %d: %w", fd, err)
			}
			klog.FromContext(cmd.Context()).Info("Forwarding", "listen", l.Addr(), "to", to)
			return relay.Serve(cmd.Context(), l, to)
		},
	}
	cmd.Flags().IntVar(&fd, "listen-fd", 0, "inherited listening socket")
	cmd.Flags().StringVar(&to, "to", "", "address to dial for each connection (host:port)")
	return cmd
}
