package core

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

// A claim beside many scheduled jobs (queued, due later) reads the due
// jobs only: the claim index orders by priority before run_at, so a walk
// bounded by run_at <= now() alone stepped over every scheduled job of the
// priorities it crossed whenever fewer jobs were due than it asked for
// (660 buffers beside 100,000, 30 ms: at 1M scheduled jobs a steady
// 1,000 jobs/s run's pickup p50 went from 2.4 to 238 ms). It now takes the
// queue's priorities one probe each and walks each priority's due range.
// It still claims in (priority, run_at, id) order.
func TestClaimBesideScheduledJobs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO relay_jobs (kind, run_at) SELECT 'future', now() + interval '1 day' + i * interval '1 ms' FROM generate_series(1, 100000) AS i`,
		`INSERT INTO relay_jobs (kind, priority, run_at) SELECT 'future', 5, now() + interval '1 day' FROM generate_series(1, 1000)`,
		`INSERT INTO relay_jobs (kind, priority) SELECT 'due', 9 FROM generate_series(1, 2)`,
		`INSERT INTO relay_jobs (kind, run_at) SELECT 'due', now() - i * interval '1 s' FROM generate_series(1, 3) AS i`,
		`VACUUM ANALYZE relay_jobs`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	buffers := regexp.MustCompile(`Buffers: shared hit=(\d+)`)
	// The claims from the front (every claim of a steady load's fetch
	// loop), from the claim floor, and from a drain's cursor (a claim
	// after one that took all it asked for), each from a position before
	// every job: the cursor's claim, at a backlog's end, has the
	// priority's scheduled jobs ahead of it.
	front := []any{DefaultQueue, 100, 30000, "explain", [16]byte(uuid.New())}
	cursor := append(append([]any{}, front...), int16(0), time.Unix(0, 0), int64(0))
	for name, c := range map[string]struct {
		sql  string
		args []any
		due  int // the due jobs it may claim
	}{
		"sqlClaim":          {sqlClaim, front, 5},
		"sqlClaimSync":      {sqlClaimSync, front, 5},
		"sqlClaimFrom":      {sqlClaimFrom, cursor, 5},
		"sqlClaimFromSync":  {sqlClaimFromSync, cursor, 5},
		"sqlClaimAfter":     {sqlClaimAfter, cursor, 3}, // priority 0's only
		"sqlClaimAfterSync": {sqlClaimAfterSync, cursor, 3},
	} {
		sql, args := c.sql, c.args
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		tx.Rollback(ctx) //nolint:errcheck
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(lines, "\n")
		if !strings.Contains(lines[0], fmt.Sprintf("rows=%d ", c.due)) {
			t.Fatalf("%s claimed other than the %d due jobs:\n%s", name, c.due, text)
		}
		// The top node's buffers are the statement's: a few per priority
		// and per job, not a walk over the scheduled ones.
		m := buffers.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("%s: no buffer counts in\n%s", name, text)
		}
		if n, _ := strconv.Atoi(m[1]); n > 200 {
			t.Fatalf("%s read %d buffers beside 101,000 scheduled jobs, want at most 200:\n%s", name, n, text)
		}
		for _, l := range lines {
			if strings.Contains(l, "Rows Removed by Filter") && !strings.Contains(l, "Rows Removed by Filter: 0") {
				t.Fatalf("%s filtered rows out: %s\n%s", name, l, text)
			}
		}
	}
	// In claim order: priority 0's due jobs oldest first, then priority 9's.
	var got []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlClaim, DefaultQueue, 4, 30000, "order", [16]byte(uuid.New())); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT priority || '@' || kind FROM relay_jobs
			WHERE state = 'claimed' AND attempted_by = 'order' ORDER BY priority, run_at, id`)
		if err != nil {
			return err
		}
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Labelled by kind, not by run_at against the clock: on a loaded
	// machine the priority-9 jobs, due since their insert, can be more
	// than a second old by now.
	if want := "0@due 0@due 0@due 9@due"; strings.Join(got, " ") != want {
		t.Fatalf("a claim of 4 took %v, want %s (the three due jobs of priority 0, then one of priority 9)", got, want)
	}
}
