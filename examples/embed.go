// Package examples holds the manifests users apply, embedded so that the lab
// applies exactly the files the tests apply.
package examples

import _ "embed"

// RBAC is rbac.yaml: the CCM's service account and least-privilege ClusterRole.
//
//go:embed rbac.yaml
var RBAC []byte
