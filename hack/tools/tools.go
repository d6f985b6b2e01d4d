//go:build tools

// Package tools pins the control-plane binaries the tests and the lab run. They
// are built from the module proxy (see build.sh), never vendored or downloaded.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
