//go:build tools

// Package tools pins Prometheus' promtool, which the chart's alerting-rule tests run
// (`promtool check rules`, `promtool test rules`): build.sh builds
// github.com/prometheus/prometheus/cmd/promtool from this module's requirements.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
