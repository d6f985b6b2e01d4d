package sshtunnel

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// keyFileMax bounds what is read as a private key or a known_hosts line
// set's worth of key: a key is a few KiB at most.
const keyFileMax = 64 << 10

// CheckFiles says what is wrong with the key and known_hosts files: the
// CCM checks them before it starts, as libvirt would only when it
// connects.
func (t *Target) CheckFiles() error {
	var errs []error
	for _, f := range []struct{ param, path string }{{"keyfile", t.KeyFile}, {"known_hosts", t.KnownHosts}} {
		if f.path == "" {
			continue
		}
		if err := readable(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", f.param, f.path, err))
		}
	}
	return errors.Join(errs...)
}

// signer reads the key: a key with a passphrase cannot be used, since
// the CCM has no one to ask for it.
func (t *Target) signer() (ssh.Signer, error) {
	f, err := openRegular(t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("keyfile %s: %w", t.KeyFile, err)
	}
	defer f.Close()
	pem, err := io.ReadAll(io.LimitReader(f, keyFileMax))
	if err == nil && len(pem) == 0 {
		err = errNoContent
	}
	if err != nil {
		return nil, fmt.Errorf("keyfile %s: %w", t.KeyFile, err)
	}
	s, err := ssh.ParsePrivateKey(pem)
	var pass *ssh.PassphraseMissingError
	if errors.As(err, &pass) {
		return nil, fmt.Errorf("keyfile %s has a passphrase, and the CCM has no one to ask for it (remove it: ssh-keygen -p -N '' -f %s)", t.KeyFile, t.KeyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("keyfile %s: %w", t.KeyFile, err)
	}
	return s, nil
}

// hostKeys is the check of the server's key against known_hosts, and the
// key algorithms to ask for: those of the keys known for this host, so a
// server with several keys shows one known_hosts has (ssh-keyscan may
// have kept only one).
func (t *Target) hostKeys(remote net.Addr) (ssh.HostKeyCallback, []string, error) {
	if t.KnownHosts == "" {
		return ssh.InsecureIgnoreHostKey(), nil, nil
	}
	if err := readable(t.KnownHosts); err != nil {
		return nil, nil, fmt.Errorf("ssh %s@%s: known_hosts %s: %w", t.user, t.addr, t.KnownHosts, err)
	}
	check, err := knownhosts.New(t.KnownHosts)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh %s@%s: known_hosts %s: %w", t.user, t.addr, t.KnownHosts, err)
	}
	// Checking a key no host has yields every key known for this one.
	var known *knownhosts.KeyError
	var algos []string
	if errors.As(check(t.addr, remote, noKey{}), &known) {
		for _, k := range known.Want {
			algos = append(algos, algorithms(k.Key.Type())...)
		}
	}
	if len(algos) == 0 {
		return nil, nil, t.unknownHost()
	}
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := check(hostname, remote, key)
		var ke *knownhosts.KeyError
		if errors.As(err, &ke) && len(ke.Want) > 0 {
			return fmt.Errorf("the host key of %s differs from the one in %s line %d (a reinstalled host, or someone in between: check it, then replace that line)", t.addr, ke.Want[0].Filename, ke.Want[0].Line)
		}
		if errors.As(err, &ke) {
			return t.unknownHost()
		}
		return err
	}, algos, nil
}

// unknownHost says how to add the host's key.
func (t *Target) unknownHost() error {
	scan := "ssh-keyscan " + t.host
	if t.port != "" {
		scan = "ssh-keyscan -p " + t.port + " " + t.host
	}
	return fmt.Errorf("ssh %s@%s: known_hosts %s has no key for %s (add it: %s >> %s)", t.user, t.addr, t.KnownHosts, t.addr, scan, t.KnownHosts)
}

// algorithms are the host key algorithms that show a key of type typ.
func algorithms(typ string) []string {
	if typ == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{typ}
}

// noKey is a public key no host has.
type noKey struct{}

func (noKey) Type() string                        { return "labcloud-no-key" }
func (noKey) Marshal() []byte                     { return []byte("labcloud-no-key") }
func (noKey) Verify([]byte, *ssh.Signature) error { return errors.New("no key") }

// readable opens path and reads its first byte, as the dial will read it.
func readable(path string) error {
	f, err := openRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Read(make([]byte, 1)); err == io.EOF {
		return errNoContent
	} else if err != nil {
		return err
	}
	return nil
}

var errNoContent = errors.New("is empty (make it with ssh-keygen, or ssh-keyscan the host into known_hosts)")

// openRegular opens path, which must be absolute and a regular file: a
// FIFO or a device would block or never end (so it is opened without
// blocking to find out).
func openRegular(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, errors.New("must be an absolute path")
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil {
		f.Close()
		return nil, err
	} else if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())
	}
	return f, nil
}
