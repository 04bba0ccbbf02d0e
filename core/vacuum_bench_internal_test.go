package core

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
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
// It reports the wall time per claim and the shared buffers one claim
// touches (EXPLAIN ANALYZE BUFFERS of the claim, after the timed loop).
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
			c := &Client{pool: pool, own: pool, cfg: Config{ID: "bench", LeaseDuration: 30e9, PollInterval: time.Hour}}
			c.completer = newCompleter(c)
			q := &queue{client: c, name: DefaultQueue}
			churnJobs(b, ctx, pool, c, q, churn)

			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rows, err := q.claim(ctx, 1, nil)
				if err != nil || len(rows) != 0 {
					b.Fatalf("claim: %d rows, %v", len(rows), err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(claimBuffers(b, ctx, pool, sqlClaim, DefaultQueue)), "buffers/claim")
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

// claimBuffers runs claim statement sql (sqlClaim's parameters) under
// EXPLAIN (ANALYZE, BUFFERS) on an empty queue and returns the shared
// buffers it touched (hit + read). extra are the statement's parameters
// after sqlClaim's five.
func claimBuffers(b *testing.B, ctx context.Context, pool *pgxpool.Pool, sql, queue string, extra ...any) int64 {
	b.Helper()
	args := append([]any{queue, 1, int64(30000), "bench", [16]byte(uuid.New())}, extra...)
	var plan []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	var js []byte
	if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&js); err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
		b.Fatalf("explain: %v", err)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read
}
