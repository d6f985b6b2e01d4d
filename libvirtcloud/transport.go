package libvirtcloud

import (
	"github.com/labcloud/labcloud/libvirtcloud/sshtunnel"
)

// CheckTransport says what is wrong with uri's ssh parameters and the
// files they name (a keyfile= and a known_hosts= that are absolute,
// readable and not empty): the CCM has no one to ask about an unknown host
// key or a key's passphrase, so both must be in place before it starts.
// Other transports need nothing.
func CheckTransport(uri string) error {
	t, err := sshtunnel.Parse(uri)
	if err != nil || t == nil {
		return err
	}
	return t.CheckFiles()
}
