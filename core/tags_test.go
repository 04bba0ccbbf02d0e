package core_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type taggedArgs struct{}

func (taggedArgs) Kind() string { return "tagged" }
func (taggedArgs) EnqueueOpts() core.EnqueueOpts {
	return core.EnqueueOpts{Tags: []string{"kind-default"}}
}

// Tags are stored with a job (single, JSON batch and COPY batch alike),
// returned by JobGet and matched by JobList, on pgx and database/sql.
func TestTagsStoredAndFiltered(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	one, err := core.Enqueue(ctx, pool, echoArgs{}, &core.EnqueueOpts{Tags: []string{"tenant:acme", "urgent", "urgent"}})
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := core.JobGet(ctx, pool, one.ID); j == nil || !slices.Equal(j.Tags, []string{"tenant:acme", "urgent"}) {
		t.Fatalf("tags read back: %+v", j)
	}
	for _, n := range []int{10, 300} { // JSON batch, COPY batch
		params := make([]core.EnqueueParams, n)
		for i := range params {
			params[i] = core.EnqueueParams{Args: echoArgs{}, Opts: &core.EnqueueOpts{Tags: []string{"tenant:acme", "bulk"}}}
		}
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			t.Fatal(err)
		}
	}
	def, _ := core.Enqueue(ctx, pool, taggedArgs{}, nil)
	over, _ := core.Enqueue(ctx, pool, taggedArgs{}, &core.EnqueueOpts{Tags: []string{"mine"}})
	untagged, _ := core.Enqueue(ctx, pool, echoArgs{}, nil)

	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	for _, db := range []core.DB{pool, sqldb} {
		list := func(p *core.JobListParams) []*core.JobRow {
			t.Helper()
			jobs, err := core.JobList(ctx, db, p)
			if err != nil {
				t.Fatal(err)
			}
			return jobs
		}
		if got := list(&core.JobListParams{Tags: []string{"tenant:acme"}, Limit: 1000}); len(got) != 311 {
			t.Fatalf("%T: tenant:acme matched %d jobs, want 311", db, len(got))
		}
		if got := list(&core.JobListParams{Tags: []string{"urgent", "tenant:acme"}}); len(got) != 1 || got[0].ID != one.ID {
			t.Fatalf("%T: urgent+tenant:acme matched %v", db, got)
		}
		if got := list(&core.JobListParams{Kinds: []string{"tagged"}}); len(got) != 2 || got[0].ID != over.ID || !slices.Equal(got[0].Tags, []string{"mine"}) ||
			got[1].ID != def.ID || !slices.Equal(got[1].Tags, []string{"kind-default"}) {
			t.Fatalf("%T: kind filter / kind default tags: %+v", db, got)
		}
		if got := list(&core.JobListParams{Limit: 1}); len(got) != 1 || got[0].ID != untagged.ID || got[0].Tags != nil {
			t.Fatalf("%T: newest first: %+v", db, got)
		}
		page := list(&core.JobListParams{Tags: []string{"bulk"}, Limit: 200})
		next := list(&core.JobListParams{Tags: []string{"bulk"}, Limit: 200, BeforeID: page[len(page)-1].ID})
		if len(page) != 200 || len(next) != 110 || next[0].ID >= page[199].ID {
			t.Fatalf("%T: pages of %d and %d", db, len(page), len(next))
		}
		if got := list(&core.JobListParams{States: []core.JobState{core.StateDead}}); len(got) != 0 {
			t.Fatalf("%T: state filter matched %d", db, len(got))
		}
		if got := list(&core.JobListParams{Queue: "nope"}); len(got) != 0 {
			t.Fatalf("%T: queue filter matched %d", db, len(got))
		}
	}
	// Behind the API, the row rules refuse an empty tag.
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET tags = '{""}' WHERE id = $1`, one.ID); err == nil {
		t.Fatal("an empty tag was stored")
	}
}
