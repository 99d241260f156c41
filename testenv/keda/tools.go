//go:build tools

// Package tools pins KEDA v2.21.0 (github.com/kedacore/keda/v2): the operator
// (cmd/operator, /keda in KEDA's image: the controllers, the scalers' gRPC Metrics Service
// on 9666 and the certificate rotation) and the external metrics API server (cmd/adapter,
// /keda-adapter: the keda-metrics-apiserver Deployment behind the APIService
// v1beta1.external.metrics.k8s.io). A build builds each main package from this module's
// requirements. KEDA's own go.mod replace and exclude lines are repeated in go.mod (a
// dependency's replace lines do not apply to the module that requires it). The admission
// webhooks (cmd/webhooks) are not needed.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
