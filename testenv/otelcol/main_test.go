package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/otelcol"
)

// config is the shape of the config the Rust tests write: OTLP/HTTP on a loopback
// port (no gRPC), spans written unbuffered to a JSON-lines file, and no internal
// metrics endpoint (its default, :8888, would clash between collectors run at once).
func config(port int, path string) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  file:
    path: %s
    rotation:
      max_megabytes: 100
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
`, port, path)
}

func TestComponents(t *testing.T) {
	f, err := components()
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Receivers) != 1 || f.Receivers[component.MustNewType("otlp")] == nil {
		t.Errorf("receivers %v, want only otlp", f.Receivers)
	}
	if len(f.Exporters) != 1 || f.Exporters[component.MustNewType("file")] == nil {
		t.Errorf("exporters %v, want only file", f.Exporters)
	}
	if len(f.Processors)+len(f.Extensions)+len(f.Connectors) != 0 {
		t.Errorf("unexpected processors, extensions or connectors: %v %v %v",
			f.Processors, f.Extensions, f.Connectors)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, good, config(4318, filepath.Join(dir, "out.jsonl")))
	// debug is a core exporter this distribution does not link.
	writeFile(t, bad, strings.ReplaceAll(config(4318, filepath.Join(dir, "out.jsonl")), "file", "debug"))

	for _, c := range []struct {
		path string
		ok   bool
	}{{good, true}, {bad, false}} {
		cmd := otelcol.NewCommand(settings())
		cmd.SetArgs([]string{"validate", "--config=file:" + c.path})
		cmd.SetOut(new(strings.Builder))
		cmd.SetErr(new(strings.Builder))
		if err := cmd.Execute(); (err == nil) != c.ok {
			t.Errorf("validate %s: err = %v, want ok = %v", filepath.Base(c.path), err, c.ok)
		}
	}
}

// TestReceivesOTLPJSON runs the collector in-process and posts one span as OTLP/JSON:
// with rotation set the file exporter writes unbuffered, so the span is in the file
// when the receiver answers.
func TestReceivesOTLPJSON(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "traces.jsonl")
	cfg := filepath.Join(dir, "config.yaml")
	port := freePort(t)
	writeFile(t, cfg, config(port, out))

	set := settings()
	set.ConfigProviderSettings.ResolverSettings.URIs = []string{"file:" + cfg}
	col, err := otelcol.NewCollector(set)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- col.Run(context.Background()) }()
	defer func() {
		col.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	url := fmt.Sprintf("http://127.0.0.1:%d/v1/traces", port)
	body := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"t"}}]},
		"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
		"name":"span-under-test","kind":2,"startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}`
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST %s: %s", url, resp.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"name":"span-under-test"`) || strings.Count(string(got), "\n") != 1 {
		t.Fatalf("output file: %q", got)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
