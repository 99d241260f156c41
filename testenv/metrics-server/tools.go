//go:build tools

// Package tools pins metrics-server v0.8.0 (sigs.k8s.io/metrics-server), the resource
// metrics API (metrics.k8s.io, an aggregated APIService) the autoscaling tests run on the
// node: a build builds its main package from this module's requirements. The upstream
// go.mod has no replace lines (v0.8.0); any it gains must be repeated here (a
// dependency's replace lines do not apply to the module that requires it).
package tools

import _ "sigs.k8s.io/metrics-server/cmd/metrics-server"
