package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestDirectivesMatchLinkedPlugins catches a CoreDNS upgrade that links a
// plugin (through some import) that the directive list does not name, or a
// directive whose plugin is not linked.
func TestDirectivesMatchLinkedPlugins(t *testing.T) {
	var linked []string
	for _, p := range caddy.ListPlugins()["others"] {
		if name, ok := strings.CutPrefix(p, "dns."); ok {
			linked = append(linked, name)
		}
	}
	want := slices.Clone(directives)
	slices.Sort(linked)
	slices.Sort(want)
	if !slices.Equal(linked, want) {
		t.Fatalf("linked dns plugins %v, directives %v", linked, want)
	}
	for _, banned := range []string{"forward", "grpc", "loop"} {
		if slices.Contains(linked, banned) {
			t.Fatalf("plugin %q is linked: the test cluster's DNS must not resolve upstream", banned)
		}
	}
}
