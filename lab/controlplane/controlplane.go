// Package controlplane runs a real Kubernetes control plane from local
// binaries: etcd, kube-apiserver and kube-controller-manager, with static
// tokens, generated certificates and a service-account key. The lab and the
// end-to-end tests share it.
package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Options describe the control plane to start.
type Options struct {
	// Tools is the directory holding etcd, kube-apiserver and kube-controller-manager.
	Tools string
	// Dir holds state, certificates, kubeconfigs and logs.
	Dir string
	// Address the API server listens on and advertises (default 127.0.0.1).
	Address string
	// Port of the API server (default: a free port).
	Port int
	// ClusterCIDR enables pod CIDR allocation in kube-controller-manager:
	// one CIDR, or one of each family separated by a comma (dual-stack).
	ClusterCIDR string
	// NodeCIDRMaskSize is the IPv4 pod CIDR size per node (default 24).
	NodeCIDRMaskSize int
	// NodeCIDRMaskSizeIPv6 is the IPv6 pod CIDR size per node (default 64).
	NodeCIDRMaskSizeIPv6 int
	// ServiceCIDR is the cluster IP range (default 10.96.0.0/16), or one of
	// each family separated by a comma, the primary family first.
	ServiceCIDR string
	// AltIPs are more addresses the API server's certificate is valid for
	// (e.g. the bridge's address of the other family).
	AltIPs []string
	// Tokens are extra static bearer tokens (e.g. for lab nodes).
	Tokens []Token
	// ControllerManagerArgs are added to kube-controller-manager's flags.
	ControllerManagerArgs []string
	// APIServerArgs are added to kube-apiserver's flags (e.g. an audit log).
	APIServerArgs []string
	// Daemon starts the processes so that they outlive the caller.
	Daemon bool
	// Scheduler starts kube-scheduler too (the lab with real nodes).
	Scheduler bool
}

// Token is a static bearer token for a user.
type Token struct {
	Token  string
	User   string
	Groups []string
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	opts      Options
	URL       string
	CAData    []byte // PEM that verifies the API server
	AdminKube string // kubeconfig path of a cluster-admin
	procs     []*Process
}

// NewToken returns a random bearer token.
func NewToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start prepares the control plane (New) and runs it (Run).
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	cp, err := New(opts)
	if err != nil {
		return nil, err
	}
	return cp, cp.Run(ctx)
}

// New checks opts and writes what the control plane's processes read:
// certificates, keys, static tokens and an admin kubeconfig. URL, CAData
// and AdminKube are set, so clients (a booting node) can be configured
// before anything listens.
func New(opts Options) (*ControlPlane, error) {
	opts = opts.withDefaults()
	if opts.Port == 0 {
		opts.Port = freePort()
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(opts.Tools, b)); err != nil {
			return nil, fmt.Errorf("control plane binary %s missing in %q (run make tools): %w", b, opts.Tools, err)
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	cp := &ControlPlane{opts: opts}
	return cp, cp.writeCredentials()
}

// withDefaults fills what opts leaves to the control plane.
func (opts Options) withDefaults() Options {
	if opts.Address == "" {
		opts.Address = "127.0.0.1"
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/16"
	}
	if opts.NodeCIDRMaskSize == 0 {
		opts.NodeCIDRMaskSize = 24
	}
	if opts.NodeCIDRMaskSizeIPv6 == 0 {
		opts.NodeCIDRMaskSizeIPv6 = 64
	}
	return opts
}

// Reopen is New for a directory whose credentials and etcd data are
// already there (a restored snapshot): nothing is written, and the
// control plane is the one those files describe. opts.Port must be the
// port the credentials were written for.
func Reopen(opts Options) (*ControlPlane, error) {
	if opts.Address == "" || opts.Port == 0 {
		return nil, errors.New("reopening a control plane needs its address and port")
	}
	opts = opts.withDefaults()
	ca, err := os.ReadFile(filepath.Join(opts.Dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("control plane in %s: %w", opts.Dir, err)
	}
	cp := &ControlPlane{opts: opts, CAData: ca}
	cp.URL = fmt.Sprintf("https://%s", net.JoinHostPort(opts.Address, strconv.Itoa(opts.Port)))
	cp.AdminKube = cp.path("admin.kubeconfig")
	if _, err := os.Stat(cp.AdminKube); err != nil {
		return nil, fmt.Errorf("control plane in %s: %w", opts.Dir, err)
	}
	return cp, nil
}

// Run starts etcd, kube-apiserver, kube-controller-manager and, when
// asked, kube-scheduler, and waits until the API server is ready. On an
// error it stops what it started.
func (cp *ControlPlane) Run(ctx context.Context) error {
	ok := false
	defer func() {
		if !ok {
			cp.Stop()
		}
	}()
	etcdURL, err := cp.startEtcd(ctx)
	if err != nil {
		return err
	}
	if err := cp.startAPIServer(ctx, etcdURL); err != nil {
		return err
	}
	if err := cp.startControllerManager(ctx); err != nil {
		return err
	}
	if cp.opts.Scheduler {
		if err := cp.startScheduler(ctx); err != nil {
			return err
		}
	}
	ok = true
	return nil
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.opts.Dir, name) }

func (cp *ControlPlane) startEtcd(ctx context.Context) (string, error) {
	client, peer := freePort(), freePort()
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	p, err := cp.start(ctx, "etcd",
		"--data-dir", cp.path("etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", // throwaway clusters: speed over durability
		"--log-level", "warn")
	if err != nil {
		return "", err
	}
	cp.procs = append(cp.procs, p)
	return clientURL, waitHTTP(ctx, p, clientURL+"/health", nil, 30*time.Second)
}

// writeCredentials issues the cluster CA and the API server's serving and
// client certificates, the service-account key, the static tokens (an
// admin's among them) and the admin kubeconfig.
func (cp *ControlPlane) writeCredentials() error {
	ip := net.ParseIP(cp.opts.Address)
	if ip == nil {
		return fmt.Errorf("control plane address %q is not an IP", cp.opts.Address)
	}
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	sans := []net.IP{ip, net.ParseIP("127.0.0.1")}
	for _, c := range strings.Split(cp.opts.ServiceCIDR, ",") {
		if first := firstIP(c); first != nil {
			sans = append(sans, first)
		}
	}
	for _, a := range cp.opts.AltIPs {
		alt := net.ParseIP(a)
		if alt == nil {
			return fmt.Errorf("control plane alternative address %q is not an IP", a)
		}
		sans = append(sans, alt)
	}
	certPEM, keyPEM, err := ca.issue("kube-apiserver", nil, sans,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	// The API server's identity towards kubelets; system:masters passes
	// their webhook authorization.
	kcPEM, kkPEM, err := ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	// The front proxy's identity, as kubeadm sets it up: delegated
	// authentication (the CCM's secure port) reads this CA from the
	// extension-apiserver-authentication ConfigMap and complains without it.
	fpPEM, fkPEM, err := ca.issue("front-proxy-client", nil, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	cp.CAData = ca.PEM
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	admin := NewToken()
	tokens := []string{fmt.Sprintf("%s,labcloud-admin,labcloud-admin,system:masters", admin)}
	for _, t := range cp.opts.Tokens {
		tokens = append(tokens, fmt.Sprintf("%s,%s,%s,%q", t.Token, t.User, t.User, strings.Join(t.Groups, ",")))
	}
	files := map[string][]byte{
		"apiserver.crt": certPEM, "apiserver.key": keyPEM, "sa.key": saPEM, "ca.crt": ca.PEM,
		"apiserver-kubelet-client.crt": kcPEM, "apiserver-kubelet-client.key": kkPEM,
		"front-proxy-client.crt": fpPEM, "front-proxy-client.key": fkPEM,
		"tokens.csv": []byte(strings.Join(tokens, "\n") + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(cp.path(name), data, 0o600); err != nil {
			return err
		}
	}
	cp.URL = fmt.Sprintf("https://%s", net.JoinHostPort(cp.opts.Address, strconv.Itoa(cp.opts.Port)))
	cp.AdminKube = cp.path("admin.kubeconfig")
	return cp.WriteKubeconfig(cp.AdminKube, "labcloud-admin", admin)
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, etcdURL string) error {
	p, err := cp.start(ctx, "kube-apiserver", append(cp.apiServerArgs(etcdURL, cp.opts.Port), cp.opts.APIServerArgs...)...)
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	return waitHTTP(ctx, p, cp.URL+"/readyz", &tls.Config{InsecureSkipVerify: true}, 60*time.Second) //nolint:gosec // readiness only, no credentials sent
}

// apiServerArgs are kube-apiserver's flags, the extra ones aside.
func (cp *ControlPlane) apiServerArgs(etcdURL string, port int) []string {
	return []string{
		"--etcd-servers", etcdURL,
		"--bind-address", cp.opts.Address, "--advertise-address", cp.opts.Address,
		"--secure-port", strconv.Itoa(port),
		"--tls-cert-file", cp.path("apiserver.crt"), "--tls-private-key-file", cp.path("apiserver.key"),
		"--token-auth-file", cp.path("tokens.csv"),
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", cp.path("sa.key"),
		"--service-account-signing-key-file", cp.path("sa.key"),
		"--service-cluster-ip-range", cp.opts.ServiceCIDR,
		"--allow-privileged",
		"--client-ca-file", cp.path("ca.crt"),
		"--kubelet-client-certificate", cp.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", cp.path("apiserver-kubelet-client.key"),
		// Node hostnames do not resolve on the host; their addresses do.
		"--kubelet-preferred-address-types", "InternalIP,ExternalIP,Hostname",
		"--requestheader-client-ca-file", cp.path("ca.crt"),
		"--requestheader-allowed-names", "front-proxy-client",
		"--requestheader-username-headers", "X-Remote-User",
		"--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--proxy-client-cert-file", cp.path("front-proxy-client.crt"),
		"--proxy-client-key-file", cp.path("front-proxy-client.key"),
		"--cert-dir", cp.path("certs"),
	}
}

func (cp *ControlPlane) startControllerManager(ctx context.Context) error {
	args, err := cp.controllerManagerArgs()
	if err != nil {
		return err
	}
	p, err := cp.start(ctx, "kube-controller-manager", args...)
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	return nil
}

// controllerManagerArgs are kube-controller-manager's flags, the extra
// ones last.
func (cp *ControlPlane) controllerManagerArgs() ([]string, error) {
	args := []string{
		"--kubeconfig", cp.AdminKube,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		// Signs the tokens of ServiceAccount token Secrets with the API
		// server's key, as kubeadm sets it up: the package's install
		// guide gives the CCM such a token.
		"--service-account-private-key-file", cp.path("sa.key"),
		"--service-cluster-ip-range", cp.opts.ServiceCIDR,
		"--controllers", "*",
	}
	if cp.opts.ClusterCIDR != "" {
		mask, err := NodeCIDRMaskArgs(cp.opts.ClusterCIDR, cp.opts.NodeCIDRMaskSize, cp.opts.NodeCIDRMaskSizeIPv6)
		if err != nil {
			return nil, err
		}
		args = append(append(args, "--allocate-node-cidrs", "--cluster-cidr", cp.opts.ClusterCIDR), mask...)
	}
	return append(args, cp.opts.ControllerManagerArgs...), nil
}

func (cp *ControlPlane) startScheduler(ctx context.Context) error {
	p, err := cp.start(ctx, "kube-scheduler", "--kubeconfig", cp.AdminKube, "--leader-elect=false")
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	return nil
}

func (cp *ControlPlane) start(ctx context.Context, name string, args ...string) (*Process, error) {
	bin, log := filepath.Join(cp.opts.Tools, name), cp.path(name+".log")
	if cp.opts.Daemon {
		return StartDaemon(log, bin, args...)
	}
	return StartProcess(ctx, log, bin, args...)
}

// WriteKubeconfig writes a kubeconfig for a bearer token.
func (cp *ControlPlane) WriteKubeconfig(path, user, token string) error {
	return WriteKubeconfig(path, cp.URL, cp.CAData, user, token)
}

// Stop stops every process, last started first.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop()
	}
	cp.procs = nil
}

// Processes returns the running processes (for memory figures).
func (cp *ControlPlane) Processes() []*Process { return cp.procs }

func waitHTTP(ctx context.Context, p *Process, url string, tlsConfig *tls.Config, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true, nil
			}
		}
		if p.Exited() {
			return false, fmt.Errorf("%s exited before %s was ready; last log lines:\n%s", p.Name, url, p.Tail(15))
		}
		return false, nil
	})
	if err != nil && ctx.Err() == nil && wait.Interrupted(err) {
		return fmt.Errorf("%s not ready after %s; last log lines:\n%s", url, timeout, p.Tail(15))
	}
	return err
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("no free port: %v", err))
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// firstIP is a Service CIDR's first address: the kubernetes Service's.
func firstIP(cidr string) net.IP {
	p, err := netip.ParsePrefix(strings.TrimSpace(cidr))
	if err != nil {
		return nil
	}
	return net.IP(p.Masked().Addr().Next().AsSlice())
}

// NodeCIDRMaskArgs are kube-controller-manager's pod CIDR size flags for
// clusterCIDR: --node-cidr-mask-size of the one family's size, or both
// per-family flags for a dual-stack pair (kube-controller-manager refuses
// --node-cidr-mask-size there).
func NodeCIDRMaskArgs(clusterCIDR string, size4, size6 int) ([]string, error) {
	var has4, has6 bool
	for _, c := range strings.Split(clusterCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("cluster CIDR %q: %w", c, err)
		}
		if p.Addr().Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	switch {
	case has4 && has6:
		return []string{"--node-cidr-mask-size-ipv4", strconv.Itoa(size4), "--node-cidr-mask-size-ipv6", strconv.Itoa(size6)}, nil
	case has6:
		return []string{"--node-cidr-mask-size", strconv.Itoa(size6)}, nil
	}
	return []string{"--node-cidr-mask-size", strconv.Itoa(size4)}, nil
}

var errNoTools = errors.New("control plane tools not found")

// FindTools returns the tools directory: $LABCLOUD_TOOLS, else the newest
// directory in /var/cache/labcloud that holds kube-apiserver.
func FindTools() (string, error) {
	if d := os.Getenv("LABCLOUD_TOOLS"); d != "" {
		return d, nil
	}
	cache := os.Getenv("LABCLOUD_CACHE")
	if cache == "" {
		cache = "/var/cache/labcloud"
	}
	matches, _ := filepath.Glob(filepath.Join(cache, "k8s-*", ".complete"))
	if len(matches) == 0 {
		return "", fmt.Errorf("%w in %s: run make tools (or hack/build-tools.sh) or set LABCLOUD_TOOLS", errNoTools, cache)
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}
