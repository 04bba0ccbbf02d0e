package main

import (
	"bytes"
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
func TestSettlesOnce(t *testing.T) { testdb.RunTwice(t, run, check) }

func check(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, "already settled") || !strings.Contains(out, "settlements recorded: 1 ") {
		t.Fatalf("output:\n%s", out)
	}
}
