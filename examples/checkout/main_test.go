package main

import (
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestCheckout(t *testing.T) { testdb.RunTwice(t, run, check) }

func check(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{"receipt job: emailing the receipt for order 42", "shop webhook: verified payment.succeeded", "events in the outbox: 1 "} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
