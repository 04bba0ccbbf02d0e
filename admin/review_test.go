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
