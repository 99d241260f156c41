//go:build tools

// Package tools pins Flux's kustomize-controller v1.9.6 (github.com/fluxcd/kustomize-controller), one of the three
// controllers the GitOps tests run on the node: build.sh builds its main package from
// this module's requirements. The controller's own go.mod replaces are repeated here
// (a dependency's replace lines do not apply to the module that requires it).
package tools

import _ "github.com/fluxcd/kustomize-controller"
