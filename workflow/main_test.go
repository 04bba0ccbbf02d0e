package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is one test's database, registry and (once started) client.
type bundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	reg    *workflow.Registry
	client *core.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
	})
	return &bundle{t: t, pool: pool, reg: reg}
}

// start runs a client executing the registry's runs on the given queues
// (default: "default"), stopped when the test ends.
func (b *bundle) start(queues ...string) *core.Client {
	b.t.Helper()
	return b.startWith(&core.Config{}, queues...)
}

func (b *bundle) startWith(cfg *core.Config, queues ...string) *core.Client {
	b.t.Helper()
	ws := core.NewWorkers()
	if err := b.reg.AddWorkers(ws); err != nil {
		b.t.Fatal(err)
	}
	cfg.Workers = ws
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.Queues == nil {
		cfg.Queues = map[string]core.QueueConfig{}
		if len(queues) == 0 {
			queues = []string{core.DefaultQueue}
		}
		for _, q := range queues {
			cfg.Queues[q] = core.QueueConfig{MaxWorkers: 4}
		}
	}
	c, err := core.NewClient(b.pool, cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(ctx)
	})
	b.client = c
	return c
}

func (b *bundle) count(sql string, args ...any) int {
	b.t.Helper()
	return testdb.Count(b.t, b.pool, sql, args...)
}

func (b *bundle) waitFor(what string, cond func() bool) {
	b.t.Helper()
	testdb.WaitFor(b.t, what, cond)
}

// result waits (bounded) for a run's outcome. When the wait runs out, it
// logs what the database holds about the run and its children (runs,
// jobs, steps, pending wake-up hand-offs): a run that slept through its
// wake-up says where.
func result[T any](t *testing.T, pool *pgxpool.Pool, id string) (T, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := workflow.Result[T](ctx, pool, id)
	if err != nil && ctx.Err() != nil {
		dumpRun(t, pool, id)
	}
	return out, err
}

// dumpRun logs run id's tree as the database holds it: each run, its job,
// its steps, and the wake-ups handed off (relay_job_rewake).
func dumpRun(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []struct{ what, sql string }{
		{"runs", `SELECT row_to_json(r)::text FROM relay_workflow_runs AS r WHERE r.id = $1 OR r.id LIKE $1 || '/%' ORDER BY r.id`},
		{"jobs", `SELECT row_to_json(j)::text || ' now=' || clock_timestamp()::text FROM relay_jobs AS j
		          WHERE j.id IN (SELECT r.job_id FROM relay_workflow_runs AS r WHERE r.id = $1 OR r.id LIKE $1 || '/%') ORDER BY j.id`},
		{"steps", `SELECT row_to_json(s)::text FROM relay_workflow_steps AS s WHERE s.run_id = $1 OR s.run_id LIKE $1 || '/%' ORDER BY s.run_id, s.position`},
		{"hand-offs", `SELECT row_to_json(w)::text FROM relay_job_rewake AS w WHERE $1 <> '' ORDER BY w.id`},
	} {
		rows, err := pool.Query(ctx, q.sql, id)
		if err != nil {
			t.Logf("run %s: read %s: %v", id, q.what, err)
			continue
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Logf("run %s: read %s: %v", id, q.what, err)
				break
			}
			t.Logf("run %s: %s: %s", id, q.what, line)
		}
		if err := rows.Err(); err != nil {
			t.Logf("run %s: read %s: %v", id, q.what, err)
		}
		rows.Close()
	}
}
