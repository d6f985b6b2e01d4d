// Package systemdroot boots a real systemd (PID 1) in a Debian bookworm root
// under systemd-nspawn, joined to a network namespace the caller made, so that
// tests can install packages and drive their units with systemctl. It needs
// root; it installs mmdebstrap and systemd-container with apt-get if missing.
//
//	root, err := systemdroot.Root(ctx, "", nil) // cached under DefaultCacheDir
//	m, err := systemdroot.Boot(ctx, systemdroot.Options{
//		Root: root, NetNS: "/run/netns/lab",
//		Capabilities: []string{"CAP_NET_ADMIN", "CAP_NET_RAW"},
//		Binds: []systemdroot.Bind{{Source: "/run/libvirt", ReadOnly: true}},
//	})
//	defer m.Stop()
//	err = m.CopyIn("labcloud.deb", "/tmp/labcloud.deb")
//	out, err := m.Exec(ctx, "dpkg", "-i", "/tmp/labcloud.deb")
//
// Inside, /tmp and /run are nspawn's tmpfs mounts: CopyIn writes through the
// container's mount table, not RootDir. The container's capability bounding
// set is nspawn's default plus Options.Capabilities, minus whatever the host
// lacks (these hosts lack CAP_SYS_RESOURCE).
package systemdroot
