package core

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
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
// Each iteration runs two claims: one from the front of the claim index
// (the floor off) and one after the claim floor a full probe sets
// (claimfloor.go). It reports the wall time of each and the shared buffers
// one claim of each kind touches (EXPLAIN ANALYZE BUFFERS, after the timed
// loop).
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
	for _, held := range []bool{false, true} {
		b.Run(fmt.Sprintf("churn=%d/held=%s", churn, yesNo(held)), func(b *testing.B) {
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
			c := &Client{pool: pool, own: pool, outcomes: pool, cfg: Config{ID: "bench", LeaseDuration: 30e9, PollInterval: time.Hour}}
			c.completer = newCompleter(c)
			q := &queue{client: c, name: DefaultQueue}
			churnJobs(b, ctx, pool, c, q, churn)
			// The floor as the keeper finds it: the churn's last entries
			// are older than floorLag by the time a probe runs.
			time.Sleep(floorLag + 50*time.Millisecond)
			at, err := q.probeFloor(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}

			// Alternate: a claim from the front, then one from the floor.
			var startNs, floorNs int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, on := range []bool{false, true} {
					q.floor.set(on, at)
					t0 := nanotime()
					rows, err := q.claim(ctx, 1, nil)
					if err != nil || len(rows) != 0 {
						b.Fatalf("claim: %d rows, %v", len(rows), err)
					}
					if on {
						floorNs += nanotime() - t0
					} else {
						startNs += nanotime() - t0
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(startNs)/float64(b.N)/1e6, "front-ms/claim")
			b.ReportMetric(float64(floorNs)/float64(b.N)/1e6, "floor-ms/claim")
			b.ReportMetric(float64(claimBuffers(b, ctx, pool, sqlClaim, DefaultQueue)), "front-buffers/claim")
			b.ReportMetric(float64(claimBuffers(b, ctx, pool, sqlClaimAfter, DefaultQueue, int16(at.priority), at.runAt, at.id)), "floor-buffers/claim")
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
