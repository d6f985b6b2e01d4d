package snapshot

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"libvirt.org/go/libvirt"
)

// memoryFile is where a guest's memory and device state goes.
func memoryFile(dir, guest string) string { return filepath.Join(dir, guest+".mem") }

// SaveGuests writes each running guest's memory and device state into w,
// all at once, while the guests run on: libvirt's external memory
// snapshot, without metadata and without touching the (read-only) disk.
// The file is in the format of virsh save, which restore reads.
func (w *Writer) SaveGuests(c *libvirt.Connect, guests []string) error {
	return each(guests, func(name string) error {
		d, err := c.LookupDomainByName(name)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", name, err)
		}
		defer d.Free()
		xml := fmt.Sprintf(`<domainsnapshot><name>labcloud</name><memory snapshot='external' file='%s'/><disks><disk name='vda' snapshot='no'/></disks></domainsnapshot>`, memoryFile(w.Dir, name))
		s, err := d.CreateSnapshotXML(xml, libvirt.DOMAIN_SNAPSHOT_CREATE_LIVE|libvirt.DOMAIN_SNAPSHOT_CREATE_NO_METADATA)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", name, err)
		}
		return s.Free()
	})
}

// RestoreGuests defines each guest of m as it was saved and starts it
// from its memory file, all at once.
func (s Store) RestoreGuests(c *libvirt.Connect, m Meta) error {
	dir := s.Path(m.ID)
	return each(m.Guests, func(name string) error {
		file := memoryFile(dir, name)
		xml, err := c.DomainSaveImageGetXMLDesc(file, libvirt.DOMAIN_SAVE_IMAGE_XML_SECURE)
		if err != nil {
			return fmt.Errorf("restore %s: %w", name, err)
		}
		d, err := c.DomainDefineXML(xml)
		if err != nil {
			return fmt.Errorf("restore %s: define: %w", name, err)
		}
		d.Free()
		if err := c.DomainRestoreFlags(file, "", libvirt.DOMAIN_SAVE_RUNNING); err != nil {
			return fmt.Errorf("restore %s: %w", name, err)
		}
		return nil
	})
}

// each runs f for every name at once and joins the errors.
func each(names []string, f func(string) error) error {
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
