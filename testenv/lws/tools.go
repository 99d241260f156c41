//go:build tools

// Package tools pins the LeaderWorkerSet controller's manager (sigs.k8s.io/lws/cmd, the
// program LWS ships as /manager in registry.k8s.io/lws/lws) in this module's dependency
// graph, so `go build sigs.k8s.io/lws/cmd` builds it at the version in go.mod, with the
// dependency versions LWS itself pins. testenv/lws.sh builds and installs it.
package tools

import (
	_ "sigs.k8s.io/lws/cmd"
)
