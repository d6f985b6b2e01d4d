package libvirtcloud

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/labcloud/labcloud/examples"
)

// A remote hypervisor is reached over ssh with libvirt's libssh transport
// (qemu+libssh://, or qemu+libssh2://): libvirt runs ssh in-process and
// reads the key and known_hosts files the URI names (keyfile=,
// known_hosts=). qemu+ssh:// execs ssh(1) instead, which reads
// known_hosts and keys from the home directory of root's passwd entry: the
// shipped unit hides it (ProtectHome) and no URI parameter names another
// known_hosts. The CCM has no one to ask about an unknown host key or a
// key's passphrase, so both files must be in place before it starts.

// CheckTransport says what is wrong with the files uri's transport needs:
// for the libssh transports a keyfile= and a known_hosts= that are
// absolute, readable and not empty (known_hosts_verify=ignore needs no
// known_hosts); qemu+ssh:// is refused. Other transports need none.
func CheckTransport(uri string) error {
	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	_, transport, _ := strings.Cut(u.Scheme, "+")
	switch transport {
	case "libssh", "libssh2":
	case "ssh":
		libssh := *u
		libssh.Scheme = strings.TrimSuffix(u.Scheme, "ssh") + "libssh"
		libssh.RawQuery = "keyfile=" + defaultKeyFile + "&known_hosts=" + defaultKnownHosts
		return fmt.Errorf("runs ssh(1), which reads its key and known_hosts from root's home directory, hidden from the CCM's unit (ProtectHome): use %s", libssh.String())
	default:
		return nil
	}
	q := u.Query()
	var errs []error
	for _, p := range []struct{ param, example string }{{"keyfile", defaultKeyFile}, {"known_hosts", defaultKnownHosts}} {
		if p.param == "known_hosts" && q.Get("known_hosts_verify") == "ignore" {
			continue
		}
		path := q.Get(p.param)
		if path == "" {
			errs = append(errs, fmt.Errorf("names no %s= (libvirt's default is in root's home directory, hidden from the CCM's unit): add %s=%s", p.param, p.param, p.example))
			continue
		}
		if err := readable(path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", p.param, path, err))
		}
	}
	return errors.Join(errs...)
}

var (
	defaultKeyFile    = examples.ConfigDir + "/id_ed25519"
	defaultKnownHosts = examples.ConfigDir + "/known_hosts"
)

// readable opens path and reads its first byte, as libvirt will read it;
// a FIFO or a device would block or never end, so only a regular file
// will do (opened without blocking to find out).
func readable(path string) error {
	if !filepath.IsAbs(path) {
		return errors.New("must be an absolute path")
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())
	}
	if _, err := f.Read(make([]byte, 1)); err == io.EOF {
		return errors.New("is empty (make it with ssh-keygen, or ssh-keyscan the host into known_hosts)")
	} else if err != nil {
		return err
	}
	return nil
}

// hostKeyUnknown ends libvirt's libssh error for a host that known_hosts
// has no key for (or no known_hosts file): it would ask whether to accept
// the key, and the CCM's connection has no one to ask.
const hostKeyUnknown = "Can't verify the session host key"

// explainConnectError adds to libvirt's error for an unknown host key
// which host and which known_hosts file, and how to add the key.
func explainConnectError(uri string, err error) error {
	u, perr := url.Parse(uri)
	if perr != nil || !strings.Contains(err.Error(), hostKeyUnknown) {
		return err
	}
	scan := "ssh-keyscan " + u.Hostname()
	if port := u.Port(); port != "" {
		scan = "ssh-keyscan -p " + port + " " + u.Hostname()
	}
	return fmt.Errorf("%w: %s has no key for %s (add it: %s >> %s)", err, u.Query().Get("known_hosts"), u.Host, scan, u.Query().Get("known_hosts"))
}
