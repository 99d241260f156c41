package fakedp

import (
	"log"
	"strings"
	"testing"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testLogger sends the plugin's log lines to the test log (shown with -v or on failure).
func testLogger(t *testing.T) *log.Logger { return log.New(testWriter{t}, "", log.Lmicroseconds) }
