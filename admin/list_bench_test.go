package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

// BenchmarkListBesideFinishedRows measures the admin API's lists beside
// RELAY_BENCH_FINISHED finished jobs (default 1,000,000; 1 % dead) through
// a real HTTP server, the token verified on every request, from
// GOMAXPROCS×-cpu parallel clients: requests/s = parallel clients / (ns/op)
// as each sub-benchmark reports it (req/s is printed). Each list's
// statements are shown with EXPLAIN ANALYZE first (-v).
//
//	go test ./admin -run '^$' -bench BenchmarkListBesideFinishedRows -benchtime 5s -v
func BenchmarkListBesideFinishedRows(b *testing.B) {
	n := 1000000
	if v, err := strconv.Atoi(os.Getenv("RELAY_BENCH_FINISHED")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool := testdb.New(b)
	for _, sql := range []string{
		`ALTER TABLE relay_jobs DISABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, queue, state, attempt, run_at, created_at, attempted_at, finalized_at, last_error)
		 SELECT 'bulk.kind', 'q' || (g % 5), CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END, 1,
		        now() - g * interval '1 second', now() - g * interval '1 second', now() - g * interval '1 second',
		        now() - g * interval '1 second' + interval '10 ms', CASE WHEN g % 100 = 0 THEN 'boom' END
		 FROM generate_series(1, ` + strconv.Itoa(n) + `) AS g`,
		`ALTER TABLE relay_jobs ENABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, queue) SELECT 'fresh.kind', 'q' || (g % 5) FROM generate_series(1, 1000) AS g`,
		`VACUUM ANALYZE relay_jobs`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	explainB := func(name, sql string, args ...any) {
		rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		if err != nil {
			b.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%s:\n%s", name, strings.Join(lines, "\n"))
	}
	list, args := sqlListJobsByID(jobFilter{}, nil, defaultLimit+1)
	explainB("GET /v1/jobs", list, args...)
	list, args = sqlListJobsByFinalized(jobFilter{States: []string{"succeeded"}}, nil, defaultLimit+1)
	explainB("GET /v1/jobs?state=succeeded", list, args...)
	list, args = sqlListJobsByID(jobFilter{Kind: "bulk.kind", Queue: "q3"}, nil, defaultLimit+1)
	explainB("GET /v1/jobs?kind=bulk.kind&queue=q3", list, args...)
	list, args = sqlListJobsByID(jobFilter{Kind: "rare.kind"}, nil, defaultLimit+1)
	explainB("GET /v1/jobs?kind=rare.kind", list, args...)
	list, args = sqlScanBoundByID(jobFilter{Kind: "rare.kind"}, nil)
	explainB("GET /v1/jobs?kind=rare.kind: where the scan stopped", list, args...)
	list, args = sqlListJobsByFinalized(jobFilter{States: []string{"succeeded"}, Kind: "rare.kind"}, nil, defaultLimit+1)
	explainB("GET /v1/jobs?state=succeeded&kind=rare.kind", list, args...)
	explainB("GET /v1/queues: stats", sqlQueueStats, 15, "")
	explainB("GET /v1/queues: minutes", sqlQueueMinutes, 15, "")

	h, err := Handler(pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	tok, err := MintToken(testSecret, TokenOpts{Issuer: testIssuer, Audience: testAudience, Subject: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range []string{
		"/v1/jobs", "/v1/jobs?state=succeeded", "/v1/jobs?state=dead", "/v1/jobs?state=queued&queue=q1",
		"/v1/jobs?kind=bulk.kind&queue=q3", "/v1/jobs?kind=rare.kind", "/v1/jobs?state=succeeded&kind=rare.kind",
		"/v1/queues?window_minutes=15", "/v1/whoami",
	} {
		b.Run(path, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
					req.Header.Set("Authorization", "Bearer "+tok)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("GET %s: %d", path, resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
