package libvirtcloud

import (
	"fmt"
	"sync"

	"libvirt.org/go/libvirt"
)

var (
	eventLoopOnce sync.Once
	eventLoopErr  error
)

// StartEventLoop registers libvirt's default event loop and runs it, once
// per process (the CCM's hypervisors, the lab's bench). libvirt needs it
// for lifecycle events and keepalive; it must be registered before the
// first connection is opened. The loop is process-wide by libvirt's design
// and so lives as long as the process.
func StartEventLoop() error {
	eventLoopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			eventLoopErr = fmt.Errorf("register libvirt event loop: %w", err)
			return
		}
		go func() {
			for {
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					// Only fails when no loop is registered, which cannot happen here.
					panic(fmt.Sprintf("libvirt event loop: %v", err))
				}
			}
		}()
	})
	return eventLoopErr
}
