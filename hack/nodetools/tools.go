//go:build tools

// Package nodetools pins what a lab node runs besides the Kubernetes
// binaries: containerd 2.x with its runc shim, and the CNI plugins. It is a
// module of its own because containerd's go.mod has an exclude block that
// `go install pkg@version` refuses, and so that its dependency graph never
// meets Kubernetes' (../tools).
package nodetools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
