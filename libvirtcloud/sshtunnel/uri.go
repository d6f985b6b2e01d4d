// Package sshtunnel reaches a remote libvirtd over ssh from inside the
// CCM's process, with Go's ssh client, and hands libvirt a Unix socket
// for it.
//
// libvirt's own ssh transports do not fit the CCM: qemu+ssh:// runs
// ssh(1), which reads its key and known_hosts from root's home (hidden by
// the unit) and which libvirt starts with capabilities it must be allowed
// to clear (the unit's bounding set forbids it); qemu+libssh:// crashes
// the client (docs/several-hosts.md). So every ssh URI is dialled here and
// libvirt talks to the remote daemon through qemu+unix://.
package sshtunnel

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/labcloud/labcloud/examples"
)

// Target is where an ssh hypervisor URI points and what proves who is
// who: one Target per configured hypervisor, read once.
type Target struct {
	uri        string // as configured, for errors
	user       string
	addr       string // host:port
	host       string // as written in the URI, for ssh-keyscan
	port       string // "" when the URI names none
	KeyFile    string
	KnownHosts string // "" when host keys are not verified
	// remote is what runs on the far side: libvirt's helper for the
	// remote driver URI, or nc on a socket the URI names.
	remote string
	// local is the URI libvirt opens, less the socket= of one dial.
	local url.URL
}

// Parse reads uri if its transport is ssh (qemu+ssh, +libssh, +libssh2:
// libvirt's parameters are the same) and returns nil for any other
// transport. It checks the URI's parameters, not the files they name.
func Parse(uri string) (*Target, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, err
	}
	driver, transport, _ := strings.Cut(u.Scheme, "+")
	switch transport {
	case "ssh", "libssh", "libssh2":
	default:
		return nil, nil
	}
	if u.Hostname() == "" {
		return nil, errors.New("names no host to reach over ssh")
	}
	t := &Target{uri: uri, user: u.User.Username(), host: u.Hostname(), port: u.Port()}
	if t.user == "" {
		t.user = "root" // libvirt's default: the user the CCM runs as
	}
	port := t.port
	if port == "" {
		port = "22"
	}
	t.addr = net.JoinHostPort(t.host, port)
	path := u.Path
	if path == "" {
		path = "/system"
	}
	q := u.Query()
	verify := "normal"
	proxy := "auto"
	for name, values := range q {
		v := values[len(values)-1]
		switch name {
		case "keyfile":
			t.KeyFile = v
		case "known_hosts":
			t.KnownHosts = v
		case "known_hosts_verify":
			verify = v
		case "no_verify":
			if v == "1" {
				verify = "ignore"
			}
		case "no_tty":
			// Nothing here asks questions: an unknown host or a key
			// with a passphrase is an error.
		case "sshauth":
			if !strings.Contains(v, "privkey") {
				return nil, fmt.Errorf("sshauth=%s: the CCM authenticates with the keyfile= only (sshauth=privkey)", v)
			}
		case "proxy":
			proxy = v
		case "socket":
			t.remote = "nc -U " + shellQuote(v)
		default:
			return nil, fmt.Errorf("parameter %s= is not one the CCM's ssh client knows (keyfile, known_hosts, known_hosts_verify, no_verify, no_tty, sshauth, proxy, socket)", name)
		}
	}
	var errs []error
	for _, f := range []struct{ param, path, example string }{{"keyfile", t.KeyFile, defaultKeyFile}, {"known_hosts", t.KnownHosts, defaultKnownHosts}} {
		switch {
		case f.param == "known_hosts" && verify == "ignore":
		case f.path == "":
			errs = append(errs, fmt.Errorf("names no %s= (libvirt's default is in root's home directory, hidden from the CCM's unit): add %s=%s", f.param, f.param, f.example))
		case !filepath.IsAbs(f.path):
			errs = append(errs, fmt.Errorf("%s %s: must be an absolute path", f.param, f.path))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	switch verify {
	case "normal", "":
	case "ignore":
		t.KnownHosts = ""
	default:
		return nil, fmt.Errorf("known_hosts_verify=%s: the CCM never adds keys to known_hosts (normal or ignore; ssh-keyscan the host into %s)", verify, t.KnownHosts)
	}
	if t.remote == "" {
		switch proxy {
		case "auto", "native":
			t.remote = "virt-ssh-helper " + driver + "://" + path
		case "netcat":
			t.remote = "nc -U /var/run/libvirt/libvirt-sock"
		default:
			return nil, fmt.Errorf("proxy=%s: not auto, native or netcat", proxy)
		}
	}
	t.local = url.URL{Scheme: driver + "+unix", Path: path}
	return t, nil
}

// The paths the docs and the errors name, in the CCM's config directory,
// which the unit can read.
const (
	defaultKeyFile    = examples.ConfigDir + "/id_ed25519"
	defaultKnownHosts = examples.ConfigDir + "/known_hosts"
)

// command is what the far side runs for a connection: virt-ssh-helper
// opens the read-only socket when told -r (a key restricted to that
// command in authorized_keys runs it whatever is asked).
func (t *Target) command(readOnly bool) string {
	if readOnly {
		if rest, ok := strings.CutPrefix(t.remote, "virt-ssh-helper "); ok {
			return "virt-ssh-helper -r " + rest
		}
		if t.remote == "nc -U /var/run/libvirt/libvirt-sock" {
			return t.remote + "-ro"
		}
	}
	return t.remote
}

// localURI is the URI libvirt opens to reach the tunnel at socket.
func (t *Target) localURI(socket string) string {
	u := t.local
	u.RawQuery = url.Values{"socket": {socket}}.Encode()
	return u.String()
}

// shellQuote quotes s for the remote user's shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
