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
	var b bytes.Buffer
	if err := run(context.Background(), testdb.URL(t), &b); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	out := b.String()
	for _, want := range []string{"receipt job: emailing the receipt for order 42", "shop webhook: verified payment.succeeded", "events in the outbox: 1 "} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
