package libvirtd

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// sshdConfig lets root in with a key only, from any address of the
// namespace, without PAM (the machine's PAM stack is not this host's).
// %[1]s is Root.
const sshdConfig = `HostKey %[1]s/ssh_host_ed25519_key
AuthorizedKeysFile %[1]s/authorized_keys
PidFile %[1]s/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
`

// makeSSHD gives Root a fresh host key and sshd's configuration.
func (p Private) makeSSHD() error {
	key := filepath.Join(p.Root, "ssh_host_ed25519_key")
	_ = os.Remove(key) // ssh-keygen would ask before overwriting it
	_ = os.Remove(key + ".pub")
	if err := keygen(key); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.Root, "sshd_config"), fmt.Appendf(nil, sshdConfig, p.Root), 0o600)
}

// keygen makes an ed25519 key without a passphrase at path (path.pub:
// its public half).
func keygen(path string) error {
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labcloud", "-f", path).CombinedOutput(); err != nil {
		return fmt.Errorf("ssh-keygen %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SSHURI is the read-only CCM's URI of the libvirtd at addr (a host name
// or IPv4 address), reached over ssh as root with the key and known_hosts
// at the paths given.
func SSHURI(addr, keyfile, knownHosts string) string {
	return "qemu+ssh://root@" + addr + "/system?keyfile=" + keyfile + "&known_hosts=" + knownHosts
}

// authorizedCCM restricts a CCM's key to what it needs, as
// docs/several-hosts.md does: libvirt's read-only socket through
// virt-ssh-helper, whatever command the client asks for; no shell, no
// forwarding.
const authorizedCCM = `restrict,command="virt-ssh-helper -r qemu:///system" `

// GrantSSH does in dir what an administrator does for a CCM that reaches
// p over ssh at addr: a key (id_ed25519, made unless dir has one) that
// p's sshd accepts for root (authorizedCCM), and p's host key added to
// known_hosts as ssh-keyscan reads it from clientNetns, the client's
// network namespace (the current one if empty). It returns their paths.
func (p Private) GrantSSH(dir, addr, clientNetns string) (keyfile, knownHosts string, err error) {
	keyfile, knownHosts = filepath.Join(dir, "id_ed25519"), filepath.Join(dir, "known_hosts")
	if _, err := os.Stat(keyfile); errors.Is(err, os.ErrNotExist) {
		if err := keygen(keyfile); err != nil {
			return "", "", err
		}
	}
	pub, err := os.ReadFile(keyfile + ".pub")
	if err != nil {
		return "", "", err
	}
	if err := appendFile(filepath.Join(p.Root, "authorized_keys"), append([]byte(authorizedCCM), pub...)); err != nil {
		return "", "", err
	}
	scan := []string{"ssh-keyscan", "-T", "5", addr}
	if clientNetns != "" {
		scan = append([]string{"ip", "netns", "exec", clientNetns}, scan...)
	}
	out, err := exec.Command(scan[0], scan[1:]...).Output()
	if err != nil || len(out) == 0 {
		return "", "", fmt.Errorf("%s: no host key (%v)", strings.Join(scan, " "), err)
	}
	return keyfile, knownHosts, appendFile(knownHosts, out)
}

// appendFile appends data to path, made 0600 if it is new.
func appendFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}
