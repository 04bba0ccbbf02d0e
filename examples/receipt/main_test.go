package main

import (
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A double submit enqueues one job; a crash after sending and a manual
// re-run still make one email.
func TestOneEmailPerOrder(t *testing.T) { testdb.RunTwice(t, run, check) }

func check(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{"duplicate=true", "crashed before recording", "already sent earlier", "2 requests, 1 email sent"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
