package core

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// BenchmarkClaimComplete claims and completes jobs in batches of n from a
// queue of queued jobs, reporting each statement's cost per job: the two
// hot statements of the worker loop, without the runtime around them. With
// limited=true a global limit applies to the queue (one that never binds:
// the cost of enforcing it, see limits.go).
func BenchmarkClaimComplete(b *testing.B) {
	for _, bc := range []struct {
		n       int
		limited bool
	}{{1, false}, {10, false}, {100, false}, {1, true}, {10, true}, {100, true}} {
		n := bc.n
		b.Run(fmt.Sprintf("batch=%d/limited=%v", n, bc.limited), func(b *testing.B) {
			pool := testdb.New(b)
			ctx := context.Background()
			total := b.N * n
			if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bench' FROM generate_series(1, $1)`, total); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
				b.Fatal(err)
			}
			if bc.limited {
				if err := SetLimit(ctx, pool, Limit{Queue: DefaultQueue, MaxRunning: 1 << 30}); err != nil {
					b.Fatal(err)
				}
			}
			c := &Client{pool: pool, own: pool, outcomes: pool, cfg: Config{ID: "bench", LeaseDuration: 30e9, PollInterval: time.Hour}}
			c.completer = newCompleter(c)
			q := &queue{client: c, name: DefaultQueue}
			var claimNs, completeNs int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := nanotime()
				rows, err := q.claim(ctx, n, nil)
				if err != nil || len(rows) != n {
					b.Fatalf("claim: %d rows, %v", len(rows), err)
				}
				t1 := nanotime()
				os := make([]outcome, len(rows))
				for i, r := range rows {
					os[i] = outcome{row: r, kind: outcomeSuccess}
				}
				done, err := c.completer.write(ctx, outcomeSuccess, os)
				if err != nil || len(done) != n {
					b.Fatalf("complete: %d rows, %v", len(done), err)
				}
				claimNs += t1 - t0
				completeNs += nanotime() - t1
			}
			b.ReportMetric(float64(claimNs)/float64(total)/1000, "claim-µs/job")
			b.ReportMetric(float64(completeNs)/float64(total)/1000, "complete-µs/job")
		})
	}
}

func nanotime() int64 { return time.Now().UnixNano() }
