package main

import (
	"errors"
	"os"
	"testing"

	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
)

// needBouncer skips the test without a pgbouncer binary, except under
// CI=true, where CI was to install it.
func needBouncer(t *testing.T) {
	t.Helper()
	if _, err := devpg.BouncerBin(); errors.Is(err, devpg.ErrNoPgBouncer) {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// The queue proof, small, with its workers through a PgBouncer in
// transaction pooling (exec mode, LISTEN direct) and jobs arriving over
// the run, then straight to the server: both audits clean, and each
// prints its pickup latency.
func TestProveQueueThroughPgBouncer(t *testing.T) {
	t.Parallel()
	needBouncer(t)
	bin := buildRelay(t)
	url := testdb.URL(t)
	for _, pooler := range []string{"pgbouncer-transaction", "direct"} {
		args := []string{"queue", "--database-url", url, "--jobs", "600", "--processes", "2", "--concurrency", "4",
			"--job-time", "30ms", "--lease", "1s", "--kill", "1", "--spread"}
		if pooler != "direct" {
			args = append(args, "--pgbouncer")
		}
		f := runProof(t, bin, args...)
		for k, want := range map[string]string{"pooler": pooler, "jobs": "600", "succeeded": "600", "lost": "0", "duplicate_effects": "0",
			"overlapping_executions": "0", "external_overlaps": "0", "kills": "1"} {
			if f[k] != want {
				t.Errorf("%s: %s=%s, want %s (%v)", pooler, k, f[k], want, f)
			}
		}
		if f["pickup_p50_ms"] == "" || f["pickup_p99_ms"] == "" {
			t.Errorf("%s: no pickup latency printed: %v", pooler, f)
		}
	}
}

// The workflow proof, small, its workers through a transaction-pooling
// PgBouncer (exec mode, LISTEN direct), with a SIGKILL: every run ends as
// its input asked, compensations included, nothing duplicated or forked.
func TestProveWorkflowThroughPgBouncer(t *testing.T) {
	t.Parallel()
	needBouncer(t)
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "workflow", "--database-url", url, "--pgbouncer", "--runs", "80", "--processes", "2", "--concurrency", "4",
		"--kill", "1", "--lease", "1s", "--sleep", "200ms", "--stall-bound", "40s")
	for k, want := range map[string]string{"runs": "80", "completed": "72", "compensated": "8", "lost": "0", "stalled": "0",
		"duplicate_tx_effects": "0", "forked_runs": "0", "order_violations": "0", "kills": "1"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
}
