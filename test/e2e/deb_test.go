package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/internal/e2etest"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/provider"
)

const debPackage = "libvirt-cloud-controller-manager"

// The Debian package as users get it on a stock libvirt host: `make deb`,
// installed by dpkg into an empty root, the kubeconfig made by the commands
// of its README.Debian, the installed cloud config left as installed, beside
// a libvirt network shaped like the stock "default" (NAT, DHCP .2-.254), and
// the installed unit's ExecStart run as it stands, confined as the unit
// confines it (its /etc/libvirt-cloud-controller-manager is the installed
// one, bind-mounted in a private mount namespace). The CCM must serve
// /healthz on the unit's port, become leader, initialize a Node, and tell a
// LoadBalancer Service which fields to set.
func TestDebPackage(t *testing.T) {
	requireEnv(t)
	tmp := t.TempDir()
	deb := e2etest.MakeDeb(t, tmp)
	checkDebArchive(t, deb)
	root := filepath.Join(tmp, "root")
	dpkgInstall(t, root, deb)
	checkConfigDir(t, root, deb)

	// The installed binary is the version-stamped one.
	want, err := exec.Command(filepath.Join(env.repo, "hack", "version.sh")).Output()
	if err != nil {
		t.Fatalf("hack/version.sh: %v", err)
	}
	out, err := exec.Command(filepath.Join(root, "usr/bin", debPackage), "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), strings.TrimSpace(string(want))) {
		t.Errorf("installed binary --version: %q, %v; want it to name %s", out, err, want)
	}

	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system", debPackage+".service"))
	if err != nil {
		t.Fatal(err)
	}
	words, err := examples.ExecStart(unit)
	if err != nil {
		t.Fatalf("the installed unit: %v", err)
	}
	if words[0] != "/usr/bin/"+debPackage {
		t.Fatalf("the installed unit runs %s, not the packaged /usr/bin/%s", words[0], debPackage)
	}
	stockDefaultNetwork(t)
	kubeconfigAsREADME(t, root)

	requireUnitPort(t)

	argv := append([]string{filepath.Join(root, words[0])}, words[1:]...)
	sandbox, err := examples.UnitSandbox(unit)
	if err != nil {
		t.Fatalf("the installed unit: %v", err)
	}
	started := time.Now()
	p, err := controlplane.StartProcess(context.Background(), filepath.Join(tmp, "ccm.log"), "unshare", withInstalled(t, root, sandbox.Wrap(argv)...)...)
	if err != nil {
		t.Fatal(err)
	}
	c := &ccm{proc: p, dir: tmp, securePort: defaultSecurePort}
	trackCCM(t, c)

	// It runs the unit's command line, word for word (unshare, sh and
	// setpriv exec into it).
	var args []string
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		args, err = cmdline(p.Pid())
		if err != nil {
			return false, err
		}
		return len(args) > 0 && args[0] == argv[0], nil
	})
	if err != nil || !slices.Equal(args, argv) {
		t.Fatalf("the CCM runs %q, want the unit's %q (%v); log:\n%s", args, argv, err, p.Tail(20))
	}

	base := fmt.Sprintf("https://127.0.0.1:%d", defaultSecurePort)
	var last string
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("the CCM exited")
		}
		code, body, err := get(base+"/healthz", "")
		last = fmt.Sprintf("%d %q %v", code, body, err)
		return err == nil && code == http.StatusOK && body == "ok", nil
	})
	if err != nil {
		t.Fatalf("no healthy /healthz on %s within 60s: %v (last: %s); log:\n%s", base, err, last, p.Tail(30))
	}
	t.Logf("the installed unit's ExecStart serves /healthz ok on %s, %s after start", base, time.Since(started).Round(time.Millisecond))
	waitLog(t, c, "Successfully acquired lease", 30*time.Second)
	l, err := env.admin.CoordinationV1().Leases("kube-system").Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		t.Fatalf("leader lease: %+v, %v", l, err)
	}

	uuid, _ := defineDomain(t, "e2e-deb", true)
	createNode(t, "e2e-deb", v1.ConditionTrue)
	n := waitNode(t, "e2e-deb", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && !hasTaint(n, uninitializedTaint) })
	if n.Spec.ProviderID != "libvirt://"+uuid {
		t.Errorf("providerID = %q, want libvirt://%s", n.Spec.ProviderID, uuid)
	}
	t.Logf("leader (%s); Node e2e-deb initialized, providerID %s", *l.Spec.HolderIdentity, n.Spec.ProviderID)

	// Load balancers are off in the installed config: a Service is told
	// which fields to set, and gets no address.
	svc := createLBService(t, "e2e-deb-lb", nil, 80)
	msg := waitEvent(t, svc, v1.EventTypeWarning, provider.ReasonNotConfigured, 60*time.Second)
	if !strings.Contains(msg, "loadBalancer.pools") {
		t.Errorf("%s event %q does not name loadBalancer.pools", provider.ReasonNotConfigured, msg)
	}
	if ip, ok := ingressIP(t, svc.Name); ok {
		t.Errorf("Service got %s with load balancers off", ip)
	}
	if !strings.Contains(p.Tail(1000), "Load balancers are off") {
		t.Errorf("the CCM does not log that load balancers are off")
	}
	if log := p.Tail(1000); strings.Contains(log, "forbidden") {
		t.Errorf("the RBAC forbids something the CCM does; log:\n%s", grepLines(log, "forbidden"))
	}
}

// requireUnitPort fails unless the unit's port and leader lease can be one
// CCM's alone: no other CCM of the suite runs.
func requireUnitPort(t *testing.T) {
	t.Helper()
	env.ccmMu.Lock()
	for _, o := range env.ccms {
		if !o.proc.Exited() {
			env.ccmMu.Unlock()
			t.Fatal("another CCM of the suite runs: the unit's CCM needs port 10258 and the leader lease")
		}
	}
	env.ccmMu.Unlock()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", defaultSecurePort))
	if err != nil {
		t.Fatalf("port %d is taken: %v", defaultSecurePort, err)
	}
	l.Close()
}

// stockDefaultNetwork makes sure libvirt's stock network runs, as on a fresh
// host: "default" as libvirt-daemon-config-network defines it (virbr0,
// 192.168.122.1/24, NAT, DHCP .2-.254: the whole subnet, so no pool could fit
// it), or one shaped like it where it is not defined. What the test started
// it stops.
func stockDefaultNetwork(t *testing.T) {
	t.Helper()
	n, err := env.virt.LookupNetworkByName("default")
	if err != nil {
		n, err = env.virt.NetworkCreateXML(`<network>
  <name>default</name>
  <forward mode='nat'/>
  <bridge name='virbr0' stp='on' delay='0'/>
  <ip address='192.168.122.1' netmask='255.255.255.0'>
    <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>
  </ip>
</network>`)
	} else if active, aerr := n.IsActive(); aerr == nil && active {
		n.Free()
		return
	} else {
		err = n.Create()
	}
	if err != nil {
		t.Fatalf("libvirt's stock default network: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Destroy(); err != nil {
			t.Errorf("stop the default network: %v", err)
		}
		n.Free()
	})
}

// checkDebArchive checks the package's control fields and file list.
func checkDebArchive(t *testing.T, deb string) {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "--show", "--showformat", "${Package}|${Architecture}|${Depends}", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --show: %v", err)
	}
	if got := string(out); got != debPackage+"|amd64|libvirt0" {
		t.Errorf("package|arch|depends = %q", got)
	}
	out, err = exec.Command("dpkg-deb", "--contents", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --contents: %v", err)
	}
	files := map[string]string{} // path -> mode
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		files[strings.TrimPrefix(f[len(f)-1], ".")] = f[0]
	}
	for path, mode := range map[string]string{
		"/usr/bin/" + debPackage:                                               "-rwxr-xr-x",
		"/lib/systemd/system/" + debPackage + ".service":                       "-rw-r--r--",
		examples.UnitCloudConfig:                                               "-rw-r--r--",
		"/usr/share/" + debPackage + "/rbac.yaml":                              "-rw-r--r--",
		"/usr/share/doc/" + debPackage + "/README.Debian":                      "-rw-r--r--",
		"/usr/share/doc/" + debPackage + "/copyright":                          "-rw-r--r--",
		"/usr/share/doc/" + debPackage + "/examples/cloud-config.yaml":         "-rw-r--r--",
		"/usr/share/doc/" + debPackage + "/examples/kubeadm-config.yaml":       "-rw-r--r--",
		"/usr/share/doc/" + debPackage + "/examples/service-loadbalancer.yaml": "-rw-r--r--",
		examples.ConfigDir + "/":                                               "drwxr-x---",
	} {
		if files[path] != mode {
			t.Errorf("%s in the package: %q, want %s", path, files[path], mode)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); f[1] != "root/root" {
			t.Errorf("%s in the package is owned by %s, want root/root", f[len(f)-1], f[1])
		}
	}
}

// checkConfigDir checks that the installed config directory is root's
// alone, also where it was 0755 before (made by hand, or by an older
// package): dpkg keeps an existing directory's mode, the postinst does not.
func checkConfigDir(t *testing.T, root, deb string) {
	t.Helper()
	dir := filepath.Join(root, examples.ConfigDir)
	check := func(when string) {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != 0o750 || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: %s has mode %04o, owner %d:%d; want 0750 root:root", when, examples.ConfigDir, fi.Mode().Perm(), st.Uid, st.Gid)
		}
	}
	check("installed")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dpkg", "--root="+root, "--force-depends", "--force-script-chrootless", "-i", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i again: %v\n%s", err, out)
	}
	check("installed again over a 0755 directory")
}

// dpkgInstall installs deb with dpkg into an empty root and checks that
// dpkg records it as installed, with the cloud config as its conffile.
// libvirt0 is not in that root (--force-depends); the maintainer scripts
// run outside it, with DPKG_ROOT set (--force-script-chrootless), since
// the root has no shell.
func dpkgInstall(t *testing.T, root, deb string) {
	t.Helper()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("dpkg", "--root="+root, "--force-depends", "--force-script-chrootless", "-i", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i: %v\n%s", err, out)
	}
	out, err := exec.Command("dpkg-query", "--root="+root, "-W", "-f=${Status}\n${Conffiles}\n", debPackage).Output()
	if err != nil {
		t.Fatalf("dpkg-query: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if lines[0] != "install ok installed" {
		t.Fatalf("dpkg status of %s: %q", debPackage, lines[0])
	}
	data, err := os.ReadFile(filepath.Join(root, examples.UnitCloudConfig))
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	wantConf := examples.UnitCloudConfig + " " + hex.EncodeToString(sum[:])
	if len(lines) != 2 || strings.TrimSpace(lines[1]) != wantConf {
		t.Errorf("conffiles of %s: %q, want %q", debPackage, lines[1:], wantConf)
	}
	list, err := exec.Command("dpkg", "--root="+root, "-L", debPackage).Output()
	if err != nil {
		t.Fatalf("dpkg -L: %v", err)
	}
	for _, f := range strings.Fields(string(list)) {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("dpkg lists %s, not installed: %v", f, err)
		}
	}
}

// kubeconfigAsREADME runs the first shell block of the installed
// README.Debian, with the suite's kubectl and admin kubeconfig, in a mount
// namespace that shows root's installed directories, and checks
// the kubeconfig it writes: private, naming a private file that holds the
// ServiceAccount's Secret token (never a command line's), which does not
// expire.
func kubeconfigAsREADME(t *testing.T, root string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(root, "usr/share/doc", debPackage, "README.Debian"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```sh\n")
	script, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("README.Debian has no ```sh block")
	}
	cmd := exec.Command("unshare", withInstalled(t, root, "bash", "-euo", "pipefail", "-c", script)...)
	cmd.Env = append(os.Environ(), "PATH="+env.tools+":"+os.Getenv("PATH"), "KUBECONFIG="+env.cp.AdminKube)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.Debian's commands: %v\n%s\n--- script:\n%s", err, out, script)
	}
	t.Cleanup(func() {
		if out, err := kubectl("-n", "kube-system", "delete", "secret", "cloud-controller-manager-token", "--ignore-not-found"); err != nil {
			t.Errorf("delete the token Secret: %v: %s", err, out)
		}
	})

	kc := filepath.Join(root, examples.UnitKubeconfig)
	if fi, err := os.Stat(kc); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v, %v; want mode 0600", kc, fi, err)
	}
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.AuthInfos[ctx.AuthInfo] == nil || cfg.Clusters[ctx.Cluster] == nil {
		t.Fatalf("kubeconfig has no usable current context: %+v", cfg)
	}
	if len(cfg.Clusters[ctx.Cluster].CertificateAuthorityData) == 0 {
		t.Errorf("the kubeconfig does not embed the cluster CA")
	}
	user := cfg.AuthInfos[ctx.AuthInfo]
	if user.Token != "" {
		t.Errorf("the kubeconfig holds the token itself; want it in a file of its own")
	}
	tokenFile := filepath.Join(root, strings.TrimPrefix(user.TokenFile, "/"))
	if !strings.HasPrefix(user.TokenFile, examples.ConfigDir+"/") {
		t.Fatalf("the kubeconfig's tokenFile is %q, want a file in %s", user.TokenFile, examples.ConfigDir)
	}
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v, %v; want mode 0600", tokenFile, fi, err)
	}
	data, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := string(data)
	secret, err := env.admin.CoreV1().Secrets("kube-system").Get(context.Background(), "cloud-controller-manager-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if token == "" || token != string(secret.Data["token"]) {
		t.Fatalf("the kubeconfig's token is not the Secret's")
	}
	// A service-account JWT: the Secret's kind has no expiry claim.
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&claims); err != nil {
		t.Fatal(err)
	}
	if claims["sub"] != "system:serviceaccount:kube-system:cloud-controller-manager" {
		t.Errorf("token subject %v", claims["sub"])
	}
	if exp, ok := claims["exp"]; ok {
		t.Errorf("the token expires (exp %v)", exp)
	}
}

// installedDirs are the package's own directories that the unit and
// README.Debian name.
var installedDirs = []string{examples.ConfigDir, "/usr/share/" + debPackage}

// withInstalled returns unshare's arguments that run argv in a private
// mount namespace where root's installedDirs are bind-mounted on their
// paths: the installed files where the unit and README.Debian expect them,
// without touching the host's. Missing mountpoints are made and removed again.
func withInstalled(t *testing.T, root string, argv ...string) []string {
	t.Helper()
	script := ""
	for i, d := range installedDirs {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Remove(d) })
		}
		script += fmt.Sprintf(`mount --bind "$%d" %s && `, i, strconv.Quote(d))
	}
	args := []string{"--mount", "--propagation", "private", "sh", "-c", script + fmt.Sprintf(`shift %d && exec "$@"`, len(installedDirs)-1)}
	for _, d := range installedDirs {
		args = append(args, filepath.Join(root, d))
	}
	return append(args, argv...)
}
