//go:build tools

// Package tools pins the main packages of the Kubernetes control plane and node in this
// module's dependency graph, so `go build k8s.io/kubernetes/cmd/<name>` resolves
// against the versions in go.mod: kube-apiserver for the control plane the tests use,
// and kube-controller-manager, kube-scheduler, kubelet and kube-proxy for the one-node
// cluster of scripts/cluster, all at one version.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
