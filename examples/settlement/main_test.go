package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestNextFireTimes(t *testing.T) {
	var b bytes.Buffer
	if err := printNext(&b, time.Date(2027, 1, 15, 0, 0, 0, 0, time.UTC), 3); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Sun 2027-01-31 02:00 EST", "Sun 2027-02-28 02:00 EST", "Wed 2027-03-31 02:00 EDT"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}

// Two runs of the month's settlement make one settlement.
func TestSettlesOnce(t *testing.T) {
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
		t.Fatal(err)
	}
	return &b
}

func check(t *testing.T, b *bytes.Buffer) {
	t.Helper()
	out := b.String()
	if !strings.Contains(out, "already settled") || !strings.Contains(out, "settlements recorded: 1 ") {
		t.Fatalf("output:\n%s", out)
	}
}
