package admin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
)

// With a read pool on a streaming standby, the lists and counts come from
// the standby and the reads of one object and the changes from the
// primary: with the standby's replay paused, a new job is missing from the
// job list and the queue list but found by id, a cancel of it succeeds
// (the standby would refuse the write) and shows at once on its page, and
// GET /v1/replica reports the lag; once replay resumes the lag drains to 0
// and the list has the job.
func TestReadPoolOnStandby(t *testing.T) {
	if _, err := devpg.BinDir(); err != nil {
		t.Skip(err)
	}
	t.Parallel()
	ctx := context.Background()
	primary, err := devpg.Start(ctx, devpg.Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() }) //nolint:errcheck
	standby, err := devpg.StartStandby(ctx, primary, devpg.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() }) //nolint:errcheck
	pool, err := pgxpool.New(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	read, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(read.Close)
	h, err := Handler(pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret}, ReadPool: read})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, pool: pool, h: h, ctx: ctx, subject: "alice@example.com"}
	b.rw = b.token(TokenOpts{})
	b.ro = b.token(TokenOpts{Subject: "reader", Scopes: []string{ScopeRead}})

	// Caught up before the pause: the migrations are on the standby.
	waitReplica(t, b, func(r map[string]any) bool { return r["lag_bytes"] == float64(0) })
	if _, err := read.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	res, err := core.Enqueue(ctx, pool, testArgs{kind: "replica.job"}, &core.EnqueueOpts{Queue: "replica-q"})
	if err != nil {
		t.Fatal(err)
	}
	// Writes after the pause: the replica reports WAL not yet replayed.
	r := waitReplica(t, b, func(r map[string]any) bool { return r["lag_bytes"] != nil && r["lag_bytes"].(float64) > 0 })
	if r["configured"] != true || r["in_recovery"] != true || r["lag_seconds"] == nil {
		t.Errorf("replica status: %v", r)
	}

	list := b.ok(b.do("GET", "/v1/jobs?queue=replica-q", b.ro, nil))
	if items := list["items"].([]any); len(items) != 0 {
		t.Errorf("the job list came from the primary, not the paused standby: %v", items)
	}
	queues := b.ok(b.do("GET", "/v1/queues", b.ro, nil))
	for _, q := range queues["items"].([]any) {
		if q.(map[string]any)["name"] == "replica-q" {
			t.Errorf("the queue list came from the primary, not the paused standby: %v", q)
		}
	}
	job := b.ok(b.do("GET", fmt.Sprintf("/v1/jobs/%d", res.ID), b.ro, nil))
	if job["state"] != "queued" {
		t.Errorf("the job by id: %v", job)
	}
	b.ok(b.do("POST", fmt.Sprintf("/v1/jobs/%d/cancel", res.ID), b.rw, nil))
	if job := b.ok(b.do("GET", fmt.Sprintf("/v1/jobs/%d", res.ID), b.ro, nil)); job["state"] != "cancelled" {
		t.Errorf("the job's page after its cancel: %v", job)
	}
	if q := b.ok(b.do("GET", "/v1/queues/replica-q", b.ro, nil)); q["dead"] == nil {
		t.Errorf("one queue by name: %v", q)
	}

	if _, err := read.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, b, func(r map[string]any) bool { return r["lag_bytes"] == float64(0) && r["lag_seconds"] == float64(0) })
	list = b.ok(b.do("GET", "/v1/jobs?queue=replica-q", b.ro, nil))
	if items := list["items"].([]any); len(items) != 1 || items[0].(map[string]any)["state"] != "cancelled" {
		t.Errorf("the job list after the standby caught up: %v", items)
	}
}

// Without a read pool, GET /v1/replica says so.
func TestReplicaStatusWithoutReadPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.ok(b.do("GET", "/v1/replica", b.ro, nil))
	if r["configured"] != false || r["in_recovery"] != false || r["lag_bytes"] != nil || r["lag_seconds"] != nil {
		t.Errorf("replica status without a read pool: %v", r)
	}
}

// waitReplica polls GET /v1/replica until ok says yes (at most 30 s) and
// returns the last answer.
func waitReplica(t *testing.T, b *bundle, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := b.ok(b.do("GET", "/v1/replica", b.ro, nil))
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica status never as wanted: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
