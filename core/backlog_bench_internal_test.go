package core

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

// fillKeyBacklog gives ordering key "hot" of the default queue a running
// head (claimed, its lease an hour long: a slow webhook, say) and n-1
// queued jobs behind it, all enqueued before anything else, so that they
// come first in claim order.
func fillKeyBacklog(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if n <= 0 {
		return nil
	}
	for _, q := range []string{
		`INSERT INTO relay_jobs (kind, ordering_key, run_at) VALUES ('backlog', 'hot', now() - interval '1 hour')`,
		`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'bench',
		        lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'
		 WHERE kind = 'backlog'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, ordering_key, run_at)
		SELECT 'backlog', 'hot', now() - interval '1 hour' FROM generate_series(2, $1)`, n)
	return err
}

// BenchmarkClaimBesideKeyBacklog claims and completes unordered jobs in
// batches of 10 beside one ordering key whose head is running and whose
// other jobs wait, queued ahead of them in claim order (issue 17): the
// outbox's hot-key case. The claim's cost must not grow with the backlog.
// RELAY_BENCH_BACKLOGS (comma-separated) overrides the sizes.
func BenchmarkClaimBesideKeyBacklog(b *testing.B) {
	sizes := []int{0, 10_000, 100_000}
	if s := os.Getenv("RELAY_BENCH_BACKLOGS"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	const batch = 10
	for _, backlog := range sizes {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			pool := testdb.New(b)
			ctx := context.Background()
			if err := fillKeyBacklog(ctx, pool, backlog); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bench' FROM generate_series(1, $1)`, b.N*batch); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
				b.Fatal(err)
			}
			var claimNs int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := nanotime()
				rows, err := pool.Query(ctx, sqlClaim, DefaultQueue, batch, 30000, "bench", [16]byte(uuid.New()))
				if err != nil {
					b.Fatal(err)
				}
				claimed, err := scanClaimed(rows, "bench")
				if err != nil || len(claimed) != batch {
					b.Fatalf("claim: %d rows, %v", len(claimed), err)
				}
				claimNs += nanotime() - t0
				ids, tokens := idsAndTokens(claimed)
				if _, err := pool.Exec(ctx, sqlCompleteMany, ids, tokens); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(claimNs)/float64(b.N)/1e6, "claim-ms")
		})
	}
}
