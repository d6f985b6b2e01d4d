// Package examples holds the manifests users apply, embedded so that the lab
// applies exactly the files the tests apply.
package examples

import _ "embed"

// RBAC is rbac.yaml: the CCM's service account, its least-privilege
// ClusterRole, the leader-election Role and the bindings that delegated
// authentication and authorization need.
//
//go:embed rbac.yaml
var RBAC []byte

// Unit is libvirt-cloud-controller-manager.service, the systemd unit.
//
//go:embed libvirt-cloud-controller-manager.service
var Unit []byte
