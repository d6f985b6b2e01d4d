package lab

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider"
)

// labCloudConfig is the cloud config of host self's CCM replica in the
// full lab: every host's libvirtd (its zone and bridge; Host.ccmURI), the lab's
// network, routes and load balancers on self's bridge, with a VIP pool in
// the bridge's subnet of each of the cluster's families (in a routed lab,
// one routed to the nodes over BGP), and BGP to the LAN router when it
// runs.
func labCloudConfig(a Addresses, router bool, hosts []Host, self Host) provider.Config {
	cfg := provider.DefaultConfig()
	cfg.Region = "lab"
	cfg.Host = self.Name
	cfg.Hypervisors = nil
	for _, h := range hosts {
		cfg.Hypervisors = append(cfg.Hypervisors, provider.HypervisorConfig{URI: h.ccmURI(self), Zone: h.Name, Host: h.Name, Bridge: Bridge})
	}
	cfg.Networks = []string{NetworkName}
	cfg.Routes.Bridge = Bridge
	cfg.LoadBalancer = provider.LoadBalancerConfig{Bridge: Bridge, Pools: a.pools, RoutedTraffic: provider.RoutedSpread}
	if self.Uplink != "" { // routed: the VIPs are on no host's segment
		cfg.LoadBalancer.Pools = []lb.PoolConfig{{Name: "lab", Addresses: []string{a.lan().VIPPool()}}}
	}
	if router {
		cfg.BGP = labBGP(self, a.Addressing)
	}
	return cfg
}

// marshalCloudConfig writes cfg as the CCM's --cloud-config: every field,
// defaults included, so the file says all the CCM will do.
func marshalCloudConfig(cfg provider.Config) ([]byte, error) {
	return yaml.Marshal(cfg)
}

func (u *upRun) startCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string) error {
	if u.opts.CloudConfig != "" {
		data, err := LoadLabCloudConfig(u.opts.CloudConfig, u.st.Addressing)
		if err != nil {
			return err
		}
		fmt.Fprintf(u.opts.Out, "           cloud config from %s\n", u.opts.CloudConfig)
		return u.runCCM(ctx, cp, client, bin, data)
	}
	if err := u.grantSSH(); err != nil {
		return err
	}
	data, err := marshalCloudConfig(labCloudConfig(u.st.addressing(), u.st.Router, u.st.Hosts, u.st.Hosts[0]))
	if err != nil {
		return err
	}
	if err := u.runCCM(ctx, cp, client, bin, data); err != nil {
		return err
	}
	for i := 1; i < len(u.st.Hosts); i++ {
		if err := u.runReplica(ctx, &u.st.Hosts[i]); err != nil {
			return err
		}
	}
	return u.waitBGPSessions(ctx)
}

// runReplica starts host h's CCM replica, in h's namespace: the command
// line of the first host's with h's cloud config.
func (u *upRun) runReplica(ctx context.Context, h *Host) error {
	data, err := marshalCloudConfig(labCloudConfig(u.st.addressing(), u.st.Router, u.st.Hosts, *h))
	if err != nil {
		return err
	}
	cfg := replicaCloudConfig(u.st.Dir, h.Name)
	if err := os.WriteFile(cfg, data, 0o600); err != nil {
		return err
	}
	h.CCMCommand = slices.Clone(u.st.CCMCommand)
	for i, a := range h.CCMCommand {
		if strings.HasPrefix(a, "--cloud-config=") {
			h.CCMCommand[i] = "--cloud-config=" + cfg
		}
	}
	pid, err := launchReplica(ctx, h, u.st.Dir)
	if err != nil {
		return fmt.Errorf("%s's CCM: %w", h.Name, err)
	}
	h.Pids[CCMProcess] = pid
	fmt.Fprintf(u.opts.Out, "           %s's replica in %s (pid %d), cloud config %s\n", h.Name, h.Netns, pid, cfg)
	return u.st.Save()
}

// runCCM starts the CCM as a daemon as examples/ ships it: the flags of the
// systemd unit (leader election, secure serving with delegated
// authentication and authorization) with the lab's own files in place of
// the unit's, and the identity of examples/rbac.yaml (a service-account
// token). The user's extra flags (Options.CCMFlags) come after the shipped
// ones, which CheckCCMFlags keeps them from naming.
func (u *upRun) runCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string, cloudCfg []byte) error {
	tr, err := client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "cloud-controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](7 * 24 * 3600)}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for the CCM service account: %w", err)
	}
	kc := filepath.Join(u.st.Dir, "ccm.kubeconfig")
	if err := cp.WriteKubeconfig(kc, "cloud-controller-manager", tr.Status.Token); err != nil {
		return err
	}
	cfg := ccmCloudConfig(u.st.Dir)
	if err := os.WriteFile(cfg, cloudCfg, 0o600); err != nil {
		return err
	}
	args, err := examples.CCMArgs(map[string]string{examples.UnitKubeconfig: kc, examples.UnitCloudConfig: cfg})
	if err != nil {
		return fmt.Errorf("the CCM's command line from examples/: %w", err)
	}
	args = withClusterCIDR(args, strings.Join(u.st.addressing().clusterCIDRs, ","))
	u.st.CCMCommand = append(append([]string{bin}, args...), u.opts.CCMFlags...)
	if err := u.st.LaunchCCM(); err != nil {
		return err
	}
	for _, f := range u.opts.CCMFlags {
		if strings.HasPrefix(f, "--secure-port=") || strings.HasPrefix(f, "--bind-address=") {
			fmt.Fprintf(u.opts.Out, "           %s: not checking the CCM's /healthz and /metrics on :%d\n", f, ccmSecurePort)
			return nil
		}
	}
	if err := checkCCMServing(ctx, u.st.Kubeconfig, fmt.Sprintf("https://127.0.0.1:%d", ccmSecurePort), 30*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(u.opts.Out, "           CCM serves /healthz and /metrics on https://127.0.0.1:%d (admin token)\n", ccmSecurePort)
	return nil
}

// ccmCloudConfig is where up writes the cloud config the CCM runs with.
func ccmCloudConfig(dir string) string { return filepath.Join(dir, "cloud-config.yaml") }

// withClusterCIDR sets the shipped command line's --cluster-cidr to the
// lab's pod ranges, as the unit tells users with another pod network to:
// the CCM routes only pod CIDRs inside it, so a dual-stack lab needs both.
func withClusterCIDR(args []string, cidr string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "--cluster-cidr=") {
			out[i] = "--cluster-cidr=" + cidr
		}
	}
	return out
}

// ccmSecurePort is the upstream CCM's secure port, which the shipped unit keeps.
const ccmSecurePort = 10258

// checkCCMServing waits until the CCM at base answers /healthz and, to the
// lab's admin (system:masters, authorized by delegation to the API
// server), /metrics, as the shipped unit promises.
func checkCCMServing(ctx context.Context, adminKubeconfig, base string, timeout time.Duration) error {
	token, err := adminToken(adminKubeconfig)
	if err != nil {
		return err
	}
	// The CCM serves with a self-signed certificate, and the token goes to
	// 127.0.0.1 in the lab's own namespace.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	var last error
	get := func(ctx context.Context, path string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if path == "/metrics" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = errors.Join(get(ctx, "/healthz"), get(ctx, "/metrics"))
		return last == nil, nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("the CCM's secure port %s after %s: %w", base, timeout, last)
	}
	return err
}

// adminToken is the lab admin's bearer token, from its kubeconfig.
func adminToken(kubeconfig string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return "", err
	}
	for _, a := range cfg.AuthInfos {
		if a.Token != "" {
			return a.Token, nil
		}
	}
	return "", fmt.Errorf("%s has no token", kubeconfig)
}

// ReplicaLeads says whether host name's CCM replica holds the leader lease,
// from the leader_election_master_status gauge on its /metrics, which it
// serves on 127.0.0.1 in its host's namespace.
func ReplicaLeads(ctx context.Context, st *State, name string) (bool, error) {
	h, err := st.hostNamed(name)
	if err != nil {
		return false, err
	}
	token, err := adminToken(st.Kubeconfig)
	if err != nil {
		return false, err
	}
	// The token goes in on standard input, not on the command line.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.Netns, "curl", "-sSk", "--max-time", "3", "-H", "@-",
		fmt.Sprintf("https://127.0.0.1:%d/metrics", ccmSecurePort))
	cmd.Stdin = strings.NewReader("Authorization: Bearer " + token + "\n")
	out, err := cmd.Output()
	if err != nil {
		return false, fmt.Errorf("%s's CCM /metrics: %w", name, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(out))
	if err != nil {
		return false, fmt.Errorf("%s's CCM /metrics: %w", name, err)
	}
	if f := families["leader_election_master_status"]; f != nil && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetGauge().GetValue() == 1, nil
	}
	return false, fmt.Errorf("%s's CCM /metrics has no leader_election_master_status", name)
}

// LaunchCCM starts the first host's CCM as a daemon, in the unit's
// sandbox, with the command recorded in the state (runCCM records it;
// chaos restarts the CCM with it) and records its pid.
func (s *State) LaunchCCM() error {
	if len(s.CCMCommand) == 0 {
		return fmt.Errorf("no CCM command in the lab state %s", statePath(s.Dir))
	}
	pid, err := launchCCM(s.CCMCommand, "", ccmLog(s.Dir))
	if err != nil {
		return err
	}
	s.Pids[CCMProcess] = pid
	return nil
}

// launchCCM starts command as a daemon confined as the shipped unit
// confines it (capabilities, no new privileges), so the lab meets what an
// installed CCM meets; in netns when not empty (the current one else).
func launchCCM(command []string, netns, log string) (int, error) {
	sandbox, err := examples.CCMSandbox()
	if err != nil {
		return 0, fmt.Errorf("the CCM's sandbox from examples/: %w", err)
	}
	argv := sandbox.Wrap(command)
	if netns != "" {
		argv = append([]string{"ip", "netns", "exec", netns}, argv...)
	}
	p, err := controlplane.StartDaemon(log, argv[0], argv[1:]...)
	if err != nil {
		return 0, err
	}
	time.Sleep(500 * time.Millisecond)
	if p.Exited() {
		return 0, fmt.Errorf("the CCM exited at start:\n%s", p.Tail(20))
	}
	return p.Pid(), nil
}
