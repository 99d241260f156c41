// Command otelcol is the OpenTelemetry Collector that the test suite runs as the
// gateway's OTLP endpoint: the gateway's OTLP trace export is tested against a real
// collector, not a mock of the protocol, so a test starts this binary with a config of
// its own, points the gateway at its OTLP/HTTP port and reads the spans it received back
// from the file the file exporter writes.
//
// It is a minimal collector distribution, laid out the way the OpenTelemetry Collector
// Builder (ocb) generates one (main.go, components.go), linking only what the tests use:
//
//   - receiver otlp (go.opentelemetry.io/collector/receiver/otlpreceiver): OTLP over
//     HTTP (protobuf and JSON) and gRPC
//   - exporter file (opentelemetry-collector-contrib/exporter/fileexporter): writes what
//     it gets as OTLP/JSON, one object per line
//   - the confmap providers file, env and yaml, to read the config a test writes
//
// The upstream distributions (otelcol, otelcol-contrib) link tens or hundreds of
// components and take many minutes to build on a small machine; this one builds in a
// fraction of that. All collector modules are at one release (core v0.161.0, stable
// v1.67.0, contrib v0.161.0): go.mod pins them, components.go names them. That release
// needs Go 1.26 (its modules' go.mod say so), hence go.mod's go line.
//
//	otelcol --config=/path/to/config.yaml
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/otelcol"
)

// The release of the collector's modules (go.mod): core, stable and contrib.
const (
	coreVersion    = "v0.161.0"
	stableVersion  = "v1.67.0"
	contribVersion = "v0.161.0"
)

func settings() otelcol.CollectorSettings {
	return otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "Infera test environment OpenTelemetry Collector (OTLP receiver, file exporter)",
			Version:     coreVersion,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
			},
		},
		ProviderModules: map[string]string{
			envprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme():  "go.opentelemetry.io/collector/confmap/provider/envprovider " + stableVersion,
			fileprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme(): "go.opentelemetry.io/collector/confmap/provider/fileprovider " + stableVersion,
			yamlprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme(): "go.opentelemetry.io/collector/confmap/provider/yamlprovider " + stableVersion,
		},
	}
}

func main() {
	if err := otelcol.NewCommand(settings()).Execute(); err != nil {
		log.Fatalf("collector server run finished with error: %v", err)
	}
}
