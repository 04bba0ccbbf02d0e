package core_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
)

type pooledArgs struct {
	N    int    `json:"n"`
	Mode string `json:"mode"`
}

func (pooledArgs) Kind() string { return "pooled" }

// syncBuffer is a log sink a test reads while the client writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runMix enqueues jobs every way a producer can (one, many, in the
// caller's transaction) and runs them with a handler that succeeds,
// retries, snoozes and completes in its own transaction, then checks every
// job succeeded with the attempts it should have.
func runMix(t *testing.T, pool *pgxpool.Pool, cfg core.Config) {
	t.Helper()
	ctx := context.Background()
	var tries sync.Map // job id → attempts seen
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[pooledArgs](func(ctx context.Context, j *core.Job[pooledArgs]) error {
		n, _ := tries.LoadOrStore(j.ID, new(atomic.Int32))
		seen := n.(*atomic.Int32).Add(1)
		switch j.Args.Mode {
		case "retry":
			if seen == 1 {
				return core.RetryIn(0, errors.New("first attempt fails"))
			}
		case "snooze":
			if seen == 1 {
				return core.Snooze(time.Millisecond)
			}
		case "tx":
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return core.CompleteTx(ctx, tx, j) })
		}
		return nil
	}))
	cfg.Workers = ws
	cfg.LeaseDuration = 3 * time.Second
	startClient(t, pool, &cfg)

	var ids []int64
	modes := []string{"ok", "retry", "snooze", "tx"}
	for i, m := range modes {
		res, err := core.Enqueue(ctx, pool, pooledArgs{N: i, Mode: m}, nil)
		if err != nil {
			t.Fatalf("enqueue %s: %v", m, err)
		}
		ids = append(ids, res.ID)
	}
	var params []core.EnqueueParams
	for i := range 20 {
		params = append(params, core.EnqueueParams{Args: pooledArgs{N: i, Mode: modes[i%len(modes)]}, Opts: &core.EnqueueOpts{OrderingKey: fmt.Sprint("k", i%3)}})
	}
	many, err := core.EnqueueMany(ctx, pool, params)
	if err != nil {
		t.Fatalf("enqueue many: %v", err)
	}
	for _, r := range many {
		ids = append(ids, r.ID)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := core.Enqueue(ctx, tx, pooledArgs{Mode: "retry"}, nil)
		ids = append(ids, res.ID)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue in a transaction: %v", err)
	}
	for _, id := range ids {
		j := waitState(t, pool, id, core.StateSucceeded)
		var args pooledArgs
		if err := json.Unmarshal(j.EncodedArgs, &args); err != nil {
			t.Fatal(err)
		}
		want := 1
		if args.Mode == "retry" {
			want = 2
		}
		if j.Attempt != want {
			t.Errorf("job %d (%s): attempt %d, want %d", id, args.Mode, j.Attempt, want)
		}
	}
}

// A client whose pool executes statements without preparing them (pgx's
// exec and simple-protocol modes, what a transaction-pooling PgBouncer
// needs) claims, heartbeats and records outcomes, straight to the server.
func TestRunsJobsWithoutPreparedStatements(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pool := openPool(t, testdb.URL(t)+"&default_query_exec_mode="+mode)
			runMix(t, pool, core.Config{})
		})
	}
}

// Through PgBouncer in transaction pooling, the client works in exec and
// simple-protocol modes: with a direct ListenerURL it listens, without one
// it says once that it polls, and nothing it logs is an error.
func TestThroughPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	b := testdb.PgBouncer(t, devpg.BouncerOptions{})
	for _, tc := range []struct {
		mode   string
		listen bool
	}{{"exec", true}, {"simple_protocol", true}, {"exec", false}} {
		t.Run(fmt.Sprintf("%s/listener=%v", tc.mode, tc.listen), func(t *testing.T) {
			t.Parallel()
			direct := testdb.URL(t)
			pool := openPool(t, testdb.Through(b, direct)+"&default_query_exec_mode="+tc.mode)
			var logs syncBuffer
			cfg := core.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), PollInterval: 100 * time.Millisecond}
			if tc.listen {
				cfg.ListenerURL = direct
			}
			runMix(t, pool, cfg)
			// What the client logs besides the handler's planned retries:
			// the startup parameter PgBouncer refused, and, without a
			// listener, that it polls. One line each.
			var said []string
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				// (The server's autovacuum setting is the test cluster's
				// business, and its warning is not about pooling.)
				if !strings.Contains(line, "job failed; will retry") && !strings.Contains(line, "autovacuum") {
					said = append(said, line)
				}
			}
			want := []string{"refused lock_timeout as a startup parameter"}
			if !tc.listen {
				want = append(want, "not listening")
			}
			if len(said) != len(want) {
				t.Fatalf("logged %d lines besides the retries, want %d (%q):\n%s", len(said), len(want), want, strings.Join(said, "\n"))
			}
			for i, w := range want {
				if !strings.Contains(said[i], w) {
					t.Errorf("line %d: want %q in %s", i, w, said[i])
				}
			}
		})
	}
}

// Through a transaction-pooling PgBouncer, a pool left in pgx's default
// mode (statements prepared and cached per connection, which such a pooler
// cannot keep) is refused at Start with ErrStatementCache, not left to
// fail statement after statement.
func TestStartRefusesStatementCacheThroughTransactionPooling(t *testing.T) {
	t.Parallel()
	b := testdb.PgBouncer(t, devpg.BouncerOptions{})
	pool := openPool(t, testdb.Through(b, testdb.URL(t)))
	c, err := core.NewClient(pool, &core.Config{Workers: core.NewWorkers()})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	if !errors.Is(err, core.ErrStatementCache) {
		c.Stop(context.Background())
		t.Fatalf("Start: %v, want ErrStatementCache", err)
	}
}

// The same when the server connection already holds another client's
// prepared statements (one server connection, another client's schema
// check first): the schema check's statement collides with theirs, and
// Start still says ErrStatementCache rather than "prepared statement
// already exists".
func TestStartRefusesStatementCacheAfterAnotherClient(t *testing.T) {
	t.Parallel()
	b := testdb.PgBouncer(t, devpg.BouncerOptions{PoolSize: 1})
	url := testdb.Through(b, testdb.URL(t))
	other := openPool(t, url)
	if err := migrations.Check(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	pool := openPool(t, url)
	c, err := core.NewClient(pool, &core.Config{Workers: core.NewWorkers()})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	if !errors.Is(err, core.ErrStatementCache) {
		c.Stop(context.Background())
		t.Fatalf("Start: %v, want ErrStatementCache", err)
	}
}

// PgBouncer refuses lock_timeout as a startup parameter in every pool mode;
// the client's bookkeeping connections then go without it, saying so once,
// and work (session pooling, where pgx's statement cache is fine).
func TestStartWithoutStartupLockTimeout(t *testing.T) {
	t.Parallel()
	b := testdb.PgBouncer(t, devpg.BouncerOptions{PoolMode: "session"})
	pool := openPool(t, testdb.Through(b, testdb.URL(t)))
	var logs syncBuffer
	runMix(t, pool, core.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if out := logs.String(); strings.Count(out, "refused lock_timeout") != 1 {
		t.Errorf("want one line about lock_timeout refused; log:\n%s", out)
	}
}
