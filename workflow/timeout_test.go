package workflow_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// noDelay retries a step at once.
var noDelay = core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })

// blockedUntil returns a channel closed when the test ends (the steps
// that ignore their context return then), and bounded waits for results.
func blockedUntil(t *testing.T) chan struct{} {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return release
}

// A step that ignores its context fails at StepOpts.Timeout, each attempt
// (retried per its policy), with ErrStepTimeout on every execution; its
// late result is never checkpointed.
func TestStepTimeoutFailsAStepThatIgnoresItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := blockedUntil(t)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "ignores-ctx", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Step(wctx, "slow", func(ctx context.Context) (int, error) {
			calls.Add(1)
			<-release // ignores ctx
			return 7, nil
		}, &workflow.StepOpts{MaxAttempts: 2, Retry: noDelay, Timeout: 100 * time.Millisecond})
		if !errors.Is(err, workflow.ErrStepTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			return 0, errors.New("want a timeout, got " + errString(err))
		}
		// Replayed after a suspension: the stored error is still a timeout.
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return 0, err
		}
		return 1, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatalf("%v %v", out, err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the step ran %d times, want 2 attempts", n)
	}
	run, err := workflow.Get(context.Background(), b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s := run.Steps[0]; s.State != "failed" || s.Attempts != 2 || s.Output != nil {
		t.Fatalf("step: state %s, %d attempts, output %s; want failed, 2, none", s.State, s.Attempts, s.Output)
	}
}

// A timed-out attempt's late result is discarded: the retry's output is
// the step's, and a StepTx's timed-out transaction never commits, even
// once its function returns.
func TestStepTimeoutDiscardsTheLateResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE effects (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	// The first call of each step blocks, ignoring its context, until the
	// run has finished; every other call returns at once. Which call blocks
	// is chosen by who comes first, not by a count of calls: under load an
	// attempt's goroutine may reach fn only after its timeout, and the
	// retry's call must not be mistaken for it.
	var stepBlocked, txBlocked atomic.Bool
	// The timeout also bounds the retry's whole attempt (for StepTx: its
	// transaction's begin, insert, checkpoint and commit), which under the
	// load of a shared CI machine can take longer than a tenth of a second;
	// the first attempts wait it out, so it is the test's cost, not a
	// margin for a race.
	opts := &workflow.StepOpts{MaxAttempts: 2, Retry: noDelay, Timeout: 2 * time.Second}
	wf := workflow.MustRegister(b.reg, "late-results", func(wctx workflow.Context, _ int) (int, error) {
		a, err := workflow.Step(wctx, "step", func(ctx context.Context) (int, error) {
			if stepBlocked.CompareAndSwap(false, true) {
				<-release // ignores ctx, returns after the retry
				return 99, nil
			}
			return 1, nil
		}, opts)
		if err != nil {
			return 0, err
		}
		c, err := workflow.StepTx(wctx, "tx", func(ctx context.Context, tx pgx.Tx) (int, error) {
			late := txBlocked.CompareAndSwap(false, true)
			k := map[bool]string{true: "late", false: "retry"}[late]
			if _, err := tx.Exec(context.Background(), `INSERT INTO effects (k) VALUES ($1)`, k); err != nil {
				return 0, err
			}
			if late {
				<-release // ignores ctx, its transaction open
				return 99, nil
			}
			return 10, nil
		}, opts)
		return a + c, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	out, err := result[int](t, b.pool, h.ID)
	close(release) // the timed-out attempts return now
	if err != nil || out != 11 {
		t.Fatalf("want the retries' outputs (11), got %v %v", out, err)
	}
	// The late transaction ends once its function returns: this insert
	// waits for it, and succeeds only if it rolled back.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := b.pool.Exec(wctx, `INSERT INTO effects (k) VALUES ('late')`); err != nil {
		t.Fatalf("the timed-out StepTx's write committed (or never ended): %v", err)
	}
	if n := b.count(`SELECT count(*) FROM effects WHERE k = 'retry'`); n != 1 {
		t.Fatalf("the retried StepTx's row exists %d times", n)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range run.Steps {
		if s.State != "completed" || s.Attempts != 2 {
			t.Fatalf("step %s: %s after %d attempts, want completed after 2", s.Key, s.State, s.Attempts)
		}
	}
	if string(run.Steps[0].Output) != "1" || string(run.Steps[1].Output) != "10" {
		t.Fatalf("outputs %s and %s, want the retries' 1 and 10", run.Steps[0].Output, run.Steps[1].Output)
	}
}

// A step started by Go that ignores its context: Get returns at the
// timeout.
func TestStepTimeoutOfGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := blockedUntil(t)
	wf := workflow.MustRegister(b.reg, "go-timeout", func(wctx workflow.Context, _ int) (bool, error) {
		f := workflow.Go(wctx, "slow", func(ctx context.Context) (int, error) {
			<-release
			return 7, nil
		}, &workflow.StepOpts{MaxAttempts: 1, Timeout: 100 * time.Millisecond})
		_, err := f.Get(wctx)
		return errors.Is(err, workflow.ErrStepTimeout), nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if out, err := result[bool](t, b.pool, h.ID); err != nil || !out {
		t.Fatalf("want ErrStepTimeout, got %v %v", out, err)
	}
}

// stepLogs keeps the messages logged with a run's id.
type stepLogs struct {
	mu   sync.Mutex
	msgs []string
}

func (h *stepLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *stepLogs) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.Key + "=" + a.Value.String(); return true })
	h.mu.Lock()
	h.msgs = append(h.msgs, line)
	h.mu.Unlock()
	return nil
}
func (h *stepLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *stepLogs) WithGroup(string) slog.Handler      { return h }

func (h *stepLogs) has(parts ...string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(m, p)
		}
		if all {
			return true
		}
	}
	return false
}

// An attempt abandoned at its timeout that returns later is logged at warn
// with its run, step and attempt, its result discarded.
func TestStepTimeoutLogsTheLateResult(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	logs := &stepLogs{}
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: slog.New(logs)})
	b := &bundle{t: t, pool: pool, reg: reg}
	release := make(chan struct{})
	wf := workflow.MustRegister(reg, "late-log", func(wctx workflow.Context, _ int) (bool, error) {
		_, err := workflow.Step(wctx, "slow", func(ctx context.Context) (int, error) {
			<-release
			return 7, nil
		}, &workflow.StepOpts{MaxAttempts: 1, Timeout: 50 * time.Millisecond})
		return errors.Is(err, workflow.ErrStepTimeout), nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), pool, wf, 0, &workflow.StartOpts{ID: "late-log"})
	if out, err := result[bool](t, pool, h.ID); err != nil || !out {
		t.Fatalf("want a timeout, got %v %v", out, err)
	}
	close(release)
	b.waitFor("the late result logged", func() bool {
		return logs.has("returned after its timeout", "run_id=late-log", "step=slow", "attempt=1")
	})
}
