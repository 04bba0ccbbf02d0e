package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The happy order completes with its email and report; the order whose
// report fails is refunded and ends compensated; both print a timeline
// and a trace id.
func TestPaymentFlow(t *testing.T) {
	var b bytes.Buffer
	if err := run(context.Background(), testdb.URL(t), &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"order-1: completed: payment 1, email msg-order-1", "order-2: compensated", "compensate:refund", "refunds: 1", "trace "} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(untraced)") {
		t.Errorf("a run without trace id:\n%s", out)
	}
}
