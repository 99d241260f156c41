//go:build tools

// Package tools pins GAIE's lightweight reference endpoint picker (cmd/lwepp of
// sigs.k8s.io/gateway-api-inference-extension), the control the endpoint-picker tests
// run behind the same Envoy as Infera's picker: build.sh builds it from this module's
// requirements.
package tools

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp"
