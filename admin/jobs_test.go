package admin

import (
	"context"
	"testing"
	"time"

	"github.com/relayq/relay/core"
)

// TestRowLockedByAnotherTransaction: a job row held by another transaction
// (a worker finishing it, a user's transaction around CompleteTx) makes a
// one-job change a 409 after the lock timeout — not a request hanging until
// its deadline and ending in a 500 — and a bulk operation skips that job
// and changes the others. Nothing is changed or audited for the locked job.
func TestRowLockedByAnotherTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := Handler(b.pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret},
		LockTimeout: 100 * time.Millisecond, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b.h = h
	locked := b.job("receipt.send", "mail", core.StateDead, "boom")
	free := b.job("receipt.send", "mail", core.StateDead, "boom")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/jobs/" + itoa(locked) + "/requeue", "/v1/jobs/" + itoa(locked) + "/cancel"} {
		b.problem(b.do("POST", path, b.rw, nil), 409)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows for refused changes", n)
	}
	res := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "requeue", "filter": map[string]any{"queue": "mail"}}))
	if res["matched"].(float64) != 2 || res["changed"].(float64) != 1 || res["skipped"].(float64) != 1 {
		t.Fatalf("bulk requeue beside a locked job: %v", res)
	}
	if b.state(free) != "queued" || b.state(locked) != "dead" {
		t.Fatalf("free job %s, locked job %s", b.state(free), b.state(locked))
	}
	// The finished jobs a bulk delete meets locked are skipped too.
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	other := b.job("receipt.send", "mail", core.StateSucceeded, "")
	res = b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "delete", "filter": map[string]any{"queue": "mail"}}))
	if res["changed"].(float64) != 1 || res["skipped"].(float64) != 1 {
		t.Fatalf("bulk delete beside a locked job: %v", res)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1`, other); n != 0 {
		t.Fatal("the unlocked finished job was not deleted")
	}
	b.problem(b.do("DELETE", "/v1/jobs/"+itoa(locked), b.rw, nil), 409)
}

// TestDryRunCountsWhatTheRunChanges: for every action, a dry run's matched
// equals the real run's, with filters and a max smaller than the matches,
// and the real run changes exactly those jobs.
func TestDryRunCountsWhatTheRunChanges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := Handler(b.pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret}, BulkBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.h = h
	for range 3 {
		b.job("a", "q1", core.StateDead, "e")
		b.job("a", "q1", core.StateCancelled, "")
		b.job("a", "q1", core.StateSucceeded, "")
		b.job("a", "q1", core.StateQueued, "")
		b.job("b", "q1", core.StateDead, "e")
		b.job("a", "q2", core.StateDead, "e")
	}
	for _, c := range []struct {
		action string
		filter map[string]any
		max    int
		want   int
	}{
		{"requeue", map[string]any{"queue": "q1", "kind": "a"}, 0, 6},
		{"cancel", map[string]any{"queue": "q1"}, 5, 5},
		{"delete", map[string]any{"state": "succeeded"}, 0, 3},
		{"requeue", map[string]any{"queue": "q2", "state": "dead"}, 0, 3},
	} {
		body := map[string]any{"action": c.action, "filter": c.filter, "dry_run": true}
		if c.max > 0 {
			body["max"] = c.max
		}
		dry := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, body))
		body["dry_run"] = false
		real := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, body))
		if dry["matched"] != real["matched"] || real["matched"].(float64) != float64(c.want) || real["changed"] != real["matched"] {
			t.Errorf("%s %v: dry %v, real %v, want %d", c.action, c.filter, dry, real, c.want)
		}
	}
}

// TestTraceIDIsHex: a job's traceparent comes from whoever enqueued it; only
// a W3C trace id (32 lowercase hex digits, not all zero) becomes trace_id
// and a trace_url — never markup a UI would put in a link.
func TestTraceIDIsHex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		`00-"><img src=x onerror=alert(1)>ab-00f067aa0ba902b7-01`: "",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": "",
	} {
		id := b.job("k", "q", core.StateDead, "e")
		b.exec(`UPDATE relay_jobs SET metadata = jsonb_build_object('traceparent', $2::text) WHERE id = $1`, id, tp)
		got := b.ok(b.do("GET", "/v1/jobs/"+itoa(id), b.ro, nil))
		tid, _ := got["trace_id"].(string)
		turl, _ := got["trace_url"].(string)
		if tid != want || (want == "") != (turl == "") {
			t.Errorf("traceparent %q: trace_id %q, trace_url %q; want trace_id %q", tp, tid, turl, want)
		}
	}
}

// TestBulkDeleteRechecksTheFilterState: a bulk delete of dead jobs deletes
// only jobs still dead when their batch runs — not one requeued and
// succeeded since it was picked (succeeded is a finished state too).
func TestBulkDeleteRechecksTheFilterState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	moved := b.job("k", "q", core.StateSucceeded, "") // picked as dead, succeeded since
	dead := b.job("k", "q", core.StateDead, "e")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	n, err := bulkBatch(b.ctx, tx, "delete", []string{"dead"}, []int64{moved, dead})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("deleted %d, want 1 (the job still dead)", n)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1`, moved) != 1 {
		t.Fatal("the succeeded job was deleted by a delete of dead jobs")
	}
}

// TestBulkRequeueRechecksTheFilterState: a bulk requeue of cancelled jobs
// leaves a job that has died since it was picked (dead is requeueable too,
// but not what was asked); a bulk cancel of queued jobs leaves one a worker
// has claimed since.
func TestBulkRequeueRechecksTheFilterState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.job("k", "q", core.StateDead, "e")          // picked as cancelled, died since
	cancelled := b.job("k", "q", core.StateCancelled, "") // still cancelled
	claimed := b.job("k", "q", core.StateClaimed, "")     // picked as queued, claimed since
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if n, err := bulkBatch(b.ctx, tx, "requeue", []string{"cancelled"}, []int64{dead, cancelled}); err != nil || n != 1 {
		t.Fatalf("requeue of cancelled jobs: %d changed, %v; want 1", n, err)
	}
	if n, err := bulkBatch(b.ctx, tx, "cancel", []string{"queued"}, []int64{claimed}); err != nil || n != 0 {
		t.Fatalf("cancel of queued jobs: %d changed, %v; want 0", n, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if b.state(dead) != "dead" || b.state(cancelled) != "queued" || b.state(claimed) != "claimed" {
		t.Fatalf("dead job %s, cancelled job %s, claimed job %s", b.state(dead), b.state(cancelled), b.state(claimed))
	}
}
