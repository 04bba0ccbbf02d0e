package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type payArgs struct {
	Order int `json:"order"`
}

func (payArgs) Kind() string { return "pay" }

// The handler's own write and the job's success commit together: a crash
// (here: a rollback) after the write leaves no effect and the job retried; the
// committed attempt leaves exactly one effect.
func TestCompleteTxExactlyOnceEffect(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id int NOT NULL, attempt int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[payArgs](func(ctx context.Context, j *core.Job[payArgs]) error {
		return pgxBeginFunc(ctx, pool, func(tx pgxTx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, j.Args.Order, j.Attempt); err != nil {
				return err
			}
			if err := core.CompleteTx(ctx, tx, j); err != nil {
				return err
			}
			if j.Attempt == 1 {
				return errors.New("crash before commit") // rolls back effect and success
			}
			return nil
		})
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	res, _ := core.Enqueue(ctx, pool, payArgs{Order: 42}, nil)
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.Attempt != 2 {
		t.Fatalf("attempt %d, want 2", j.Attempt)
	}
	if n := count(t, pool, `SELECT count(*) FROM payments WHERE order_id = 42`); n != 1 {
		t.Fatalf("%d payments, want exactly 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM payments WHERE attempt = 2`); n != 1 {
		t.Fatal("the payment is not the committed attempt's")
	}
	waitFor(t, "success counted", func() bool { return c.Stats().Succeeded == 1 })
}

// CompleteTx refuses an attempt that lost its lease, so the handler rolls its
// effect back.
func TestCompleteTxLeaseLost(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (job_id bigint)`); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	proceed := make(chan struct{})
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[payArgs](func(ctx context.Context, j *core.Job[payArgs]) error {
		<-proceed
		err := pgxBeginFunc(context.Background(), pool, func(tx pgxTx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, j.ID); err != nil {
				return err
			}
			return core.CompleteTx(ctx, tx, j)
		})
		got <- err
		return err
	}))
	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Minute})
	res, _ := core.Enqueue(ctx, pool, payArgs{}, nil)
	waitState(t, pool, res.ID, core.StateClaimed)
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, run_at = now() + interval '1 hour' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := <-got; !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("CompleteTx: %v, want ErrLeaseLost", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("effect committed despite lost lease")
	}
}

type pgxTx = interface {
	core.DB
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func pgxBeginFunc(ctx context.Context, pool *pgxpool.Pool, f func(tx pgxTx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

type bytesArgs struct {
	Mode string `json:"mode"`
}

func (bytesArgs) Kind() string { return "fail_with_bytes" }

// Error messages, stacks and panic values holding invalid UTF-8 or NUL
// bytes are recorded (sanitised), not lost to a failed write.
func TestFailureWithInvalidBytesIsRecorded(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[bytesArgs](func(ctx context.Context, j *core.Job[bytesArgs]) error {
		if j.Args.Mode == "panic" {
			panic("boom \x00 \xff\xfe")
		}
		return errors.New("bad bytes \xff\xfe and a nul \x00 here")
	}))
	// A long lease: a lost failure write would show as "lease expired" only
	// after it, so the wait below would time out instead.
	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Hour})
	for _, mode := range []string{"error", "panic"} {
		res, err := core.Enqueue(ctx, pool, bytesArgs{Mode: mode}, &core.EnqueueOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		j := waitState(t, pool, res.ID, core.StateDead)
		if strings.Contains(j.LastError, "lease expired") || !strings.Contains(j.LastError, "\uFFFD") || !strings.Contains(j.LastError, `\x00`) {
			t.Fatalf("%s: last_error = %q", mode, j.LastError)
		}
		if len(j.History) != 1 || j.History[0].Error != j.LastError {
			t.Fatalf("%s: history = %+v", mode, j.History)
		}
		if mode == "panic" && !strings.Contains(j.LastError, "panicked") {
			t.Fatalf("panic not recorded as one: %q", j.LastError)
		}
	}
}
