package core

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/relayq/relay/testkit/testdb"
)

// Snooze and Wake probe the primary key, beside thousands of claimed jobs
// (internal/fence checks its statements the same way).
func TestSnoozeWakeHoldProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bulk' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	var id int64
	var token [16]byte
	if err := pool.QueryRow(ctx, sqlClaim, "default", 5000, 30000, "w", [16]byte(uuid.New())).Scan(
		&id, new(string), new(string), new(int16), new(int), new(int), new(any), new(any), new(any), new([]byte), new([]byte), &token, new(string), new([]string)); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"snooze": {sqlSnooze, []any{id, token, 0}},
		"wake":   {sqlWake, []any{id}},
	} {
		plan := explain(t, pool, st.sql, st.args...)
		if !strings.Contains(plan, "relay_jobs_pkey") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s does not probe the primary key:\n%s", name, plan)
		}
	}
}

// A wake that holds the job's row when the attempt snoozes (the waker's
// transaction not yet committed, its wake time later than the snooze
// statement's start) leaves the job due at once, and the snooze says so:
// the client claims it again without waiting for its poll. The waker saw
// the job claimed, so it sent no notification; a snooze that answered
// "not due" lost the wake-up until the next poll.
func TestSnoozeReportsAWakeItWaitedFor(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) VALUES ('snoozer')`); err != nil {
		t.Fatal(err)
	}
	var id int64
	var token [16]byte
	if err := pool.QueryRow(ctx, sqlClaim, "default", 1, 30000, "w", [16]byte(uuid.New())).Scan(
		&id, new(string), new(string), new(int16), new(int), new(int), new(any), new(any), new(any), new([]byte), new([]byte), &token, new(string), new([]string)); err != nil {
		t.Fatal(err)
	}
	// The snooze's transaction starts first (its now() is earlier than the
	// wake's time), as an autocommit statement that started and then
	// waited for the row does.
	snoozer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer snoozer.Rollback(ctx) //nolint:errcheck
	if _, err := snoozer.Exec(ctx, `SELECT now()`); err != nil {
		t.Fatal(err)
	}
	waker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waker.Rollback(ctx) //nolint:errcheck
	if err := Wake(ctx, waker, id); err != nil {
		t.Fatal(err)
	}
	type snoozed struct {
		due bool
		err error
	}
	got := make(chan snoozed, 1)
	go func() {
		var s snoozed
		s.err = snoozer.QueryRow(ctx, sqlSnooze, id, token, time.Hour.Microseconds()).Scan(&s.due)
		got <- s
	}()
	testdb.WaitFor(t, "the snooze to wait for the waker's lock", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) == 1
	})
	if err := waker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.err != nil {
		t.Fatal(s.err)
	}
	if err := snoozer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'queued' AND run_at <= now()`, id); n != 1 {
		t.Fatal("the woken job is not due at once after its snooze")
	}
	if !s.due {
		t.Error("the snooze reported a job woken meanwhile as not due: the client waits for its poll to claim it")
	}
}
