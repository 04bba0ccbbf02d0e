package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestCheckout(t *testing.T) {
	// Twice on one database, as a newcomer re-running it on a shared
	// DATABASE_URL would: the second run says what it found and gives the
	// same results.
	url := testdb.URL(t)
	for i := range 2 {
		b := runOnce(t, url)
		if i == 1 && !strings.Contains(b.String(), "left from a previous run") {
			t.Errorf("the second run does not say what it found:\n%s", b.String())
		}
		check(t, b)
	}
}

func runOnce(t *testing.T, url string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	if err := run(context.Background(), url, &b); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	return &b
}

func check(t *testing.T, b *bytes.Buffer) {
	t.Helper()
	out := b.String()
	for _, want := range []string{"receipt job: emailing the receipt for order 42", "shop webhook: verified payment.succeeded", "events in the outbox: 1 "} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
