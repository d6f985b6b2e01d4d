//go:build tools

// Package tools pins the Kubernetes binaries the tests and the lab run: the
// control plane, the node components, agnhost and the upstream e2e suite. They
// are built from the module proxy (see ../build-tools.sh), never vendored or
// downloaded.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"

	// Ginkgo's runner, which shares the e2e specs among parallel processes.
	_ "github.com/onsi/ginkgo/v2/ginkgo"

	// What k8s.io/kubernetes/test/e2e's test main imports, so that
	// `go test -c k8s.io/kubernetes/test/e2e` resolves from this module.
	_ "github.com/onsi/ginkgo/v2"
	_ "k8s.io/kubernetes/test/conformance/testdata"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/cloud"
	_ "k8s.io/kubernetes/test/e2e/framework/config"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/framework/testfiles"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/e2e/testing-manifests"
	_ "k8s.io/kubernetes/test/fixtures"
)
