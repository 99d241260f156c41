//go:build tools

// Package tools pins the kube-apiserver main package in this module's
// dependency graph so `go build k8s.io/kubernetes/cmd/kube-apiserver` resolves
// against the versions in go.mod.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
