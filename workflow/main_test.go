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

// result waits (bounded) for a run's outcome.
func result[T any](t *testing.T, pool *pgxpool.Pool, id string) (T, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return workflow.Result[T](ctx, pool, id)
}
