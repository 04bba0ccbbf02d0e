package core

import (
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// A tag filter finds its jobs through the partial GIN index of tagged
// rows, not by walking every job.
func TestJobListTagFilterUsesTheTagIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'plain' FROM generate_series(1, 50000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, tags) SELECT 'tagged', '{needle,tenant:acme}' FROM generate_series(1, 20)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	plan := explain(t, pool, sqlListJobs, "", "[]", "[]", `["needle"]`, true, int64(0), 100)
	if !strings.Contains(plan, "relay_jobs_tags_idx") {
		t.Fatalf("the tag filter does not use relay_jobs_tags_idx:\n%s", plan)
	}
	jobs, err := JobList(ctx, pool, &JobListParams{Tags: []string{"needle"}})
	if err != nil || len(jobs) != 20 {
		t.Fatalf("%d jobs, %v", len(jobs), err)
	}
}
