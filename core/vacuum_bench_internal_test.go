package core

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/testdb"
)

// BenchmarkClaimAfterChurn measures a claim on an empty queue after
// RELAY_BENCH_CHURN jobs (default 100,000; the figure is
// 1,000,000) were enqueued, claimed and completed with no VACUUM (the test
// server runs with autovacuum off), issue 17 item 3:
//
//   - held=no: nothing holds the xmin horizon. The claimed jobs' entries
//     in the claim index are dead to everyone, so a scan marks them
//     (LP_DEAD) as it passes; until VACUUM removes them, each later claim
//     still reads their pages.
//   - held=yes: an idle-in-transaction session took a snapshot before the
//     churn, so no entry can be marked dead: every claim follows each one to
//     the heap.
//
// claim=start is a claim from the front of the claim index (the floor
// off); claim=floor one after the claim floor a full probe sets
// (claimfloor.go). It reports the wall time per claim and the shared
// buffers one claim touches (EXPLAIN ANALYZE BUFFERS of the claim, after
// the timed loop).
// Run it alone: go test ./core -run '^$' -bench ClaimAfterChurn -benchtime 20x
func BenchmarkClaimAfterChurn(b *testing.B) {
	churn := 100_000
	if s := os.Getenv("RELAY_BENCH_CHURN"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("RELAY_BENCH_CHURN=%q: want a positive count", s)
		}
		churn = n
	}
	for _, bc := range []struct{ held, floor bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		held := bc.held
		claim := map[bool]string{false: "start", true: "floor"}[bc.floor]
		b.Run(fmt.Sprintf("churn=%d/held=%s/claim=%s", churn, yesNo(held), claim), func(b *testing.B) {
			pool := testdb.New(b)
			ctx := context.Background()
			truncate := func() {
				if _, err := pool.Exec(ctx, `TRUNCATE relay_jobs`); err != nil {
					b.Fatal(err)
				}
			}
			truncate()
			b.Cleanup(truncate)
			if held {
				conn, err := pool.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { tx.Rollback(ctx); conn.Release() }) //nolint:errcheck
			}
			c := &Client{pool: pool, own: pool, cfg: Config{ID: "bench", LeaseDuration: 30e9, PollInterval: time.Hour}}
			c.completer = newCompleter(c)
			q := &queue{client: c, name: DefaultQueue}
			churnJobs(b, ctx, pool, c, q, churn)
			sql, extra := sqlClaim, []any(nil)
			if bc.floor {
				// As the keeper finds it: the churn's last entries are
				// older than floorLag by the time a probe runs.
				time.Sleep(floorLag + 50*time.Millisecond)
				at, err := q.probeFloor(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				q.floor.set(true, at)
				sql, extra = sqlClaimAfter, []any{int16(at.priority), at.runAt, at.id}
			}

			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rows, err := q.claim(ctx, 1, nil)
				if err != nil || len(rows) != 0 {
					b.Fatalf("claim: %d rows, %v", len(rows), err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(claimBuffers(b, ctx, pool, sql, DefaultQueue, extra...)), "buffers/claim")
		})
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// churnJobs enqueues, claims and completes n jobs in batches of 5,000,
// each claim starting after the previous batch (so the churn itself does
// not walk what it left behind).
func churnJobs(b *testing.B, ctx context.Context, pool *pgxpool.Pool, c *Client, q *queue, n int) {
	b.Helper()
	var after *claimCursor
	for done := 0; done < n; {
		batch := min(5000, n-done)
		if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bench' FROM generate_series(1, $1)`, batch); err != nil {
			b.Fatal(err)
		}
		rows, err := q.claim(ctx, batch, after)
		if err != nil || len(rows) != batch {
			b.Fatalf("churn claim: %d rows of %d, %v", len(rows), batch, err)
		}
		os := make([]outcome, len(rows))
		for i, r := range rows {
			os[i] = outcome{row: r, kind: outcomeSuccess}
			if p := (claimCursor{r.Priority, r.RunAt, r.ID}); after == nil || after.less(p) {
				after = &p
			}
		}
		if written, err := c.completer.write(ctx, outcomeSuccess, os); err != nil || len(written) != batch {
			b.Fatalf("churn complete: %d rows, %v", len(written), err)
		}
		done += batch
	}
}

func claimBuffers(b *testing.B, ctx context.Context, pool *pgxpool.Pool, sql, queue string, extra ...any) int64 {
	return claimBuffersTB(b, pool, sql, queue, extra...)
}
