package workflow_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// runLogs records the run id of each "run ended" log line.
type runLogs struct {
	mu    sync.Mutex
	ended map[string]int
}

func (h *runLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *runLogs) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "run ended") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "run_id" {
			h.mu.Lock()
			h.ended[a.Value.String()]++
			h.mu.Unlock()
		}
		return true
	})
	return nil
}
func (h *runLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *runLogs) WithGroup(string) slog.Handler      { return h }

func (h *runLogs) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended[id]
}

type payOrder struct {
	ID string `json:"id"`
}

type payCharge struct {
	Amount int `json:"amount"`
}

type payApproval struct {
	OK bool `json:"ok"`
}

// Stored workflow values of the wrong shape, written behind the API with
// plain SQL, fail their own run only: an input, a completed step's output,
// a child's outcome or a recorded value that no longer decodes into the
// workflow's types fails that run with the decode error
// (stored in the run: the admin API shows it; logged once with the run's
// id), and the run's job ends: it is not retried in a loop. A stored output
// or event that does not decode fails the Result or GetEvent asking for
// it, naming the run. A stored signal of another shape is set aside (its
// decode error kept with it) and its run waits on for the next. A stored
// trace context of another shape costs its run only its parent span. The
// runs beside them complete.
func TestUndecodableStoredValuesFailTheirRunOnly(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	logs := &runLogs{ended: map[string]int{}}
	reg := workflow.NewRegistry(pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
		Logger:         slog.New(logs),
	})
	b := &bundle{t: t, pool: pool, reg: reg}
	ctx := context.Background()
	wf := workflow.MustRegister(reg, "pay", func(wctx workflow.Context, in payOrder) (payCharge, error) {
		c, err := workflow.Step(wctx, "charge", func(ctx context.Context) (payCharge, error) { return payCharge{len(in.ID)}, nil }, nil)
		if err != nil {
			return payCharge{}, err
		}
		if err := workflow.SetEvent(wctx, "status", payApproval{true}); err != nil {
			return payCharge{}, err
		}
		if in.ID == "quick" {
			return c, nil
		}
		if _, _, err := workflow.WaitSignal[payApproval](wctx, "approve", 0); err != nil {
			return payCharge{}, err
		}
		return c, nil
	})
	kid := workflow.MustRegister(reg, "kid", func(wctx workflow.Context, n int) (int, error) { return n + 1, nil })
	parent := workflow.MustRegister(reg, "parent", func(wctx workflow.Context, n int) (int, error) {
		got, err := workflow.Child(wctx, "kid", kid, n, nil).Get(wctx)
		if err != nil {
			return 0, err
		}
		workflow.Now(wctx, "at")
		if _, _, err := workflow.WaitSignal[payApproval](wctx, "approve", 0); err != nil {
			return 0, err
		}
		return got, nil
	})
	for _, id := range []string{"bad-child", "bad-recorded"} {
		if _, err := workflow.Start(ctx, pool, parent, 1, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	start := func(id string) {
		t.Helper()
		if _, err := workflow.Start(ctx, pool, wf, payOrder{id}, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Input: written before any execution reads it.
	start("bad-input")
	b.exec(`UPDATE relay_workflow_runs SET input = '"text"' WHERE id = 'bad-input'`)
	for _, id := range []string{"bad-step", "bad-signal", "good", "quick"} {
		start(id)
	}
	// A trace context of another shape costs the run only its parent span.
	b.exec(`UPDATE relay_workflow_runs SET trace = '{"traceparent": 5}' WHERE id = 'good'`)
	b.start()
	b.waitFor("the waiting runs to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE kind = 'signal' AND state = 'waiting'`) == 5
	})
	// A child's outcome and a recorded value, checkpointed in the parent.
	b.exec(`UPDATE relay_workflow_steps SET output = '"text"' WHERE run_id = 'bad-child' AND kind = 'child'`)
	b.exec(`UPDATE relay_workflow_steps SET output = '"text"' WHERE run_id = 'bad-recorded' AND key = 'at'`)
	// A completed step's output, then the signal that makes the run
	// replay it.
	b.exec(`UPDATE relay_workflow_steps SET output = '"text"' WHERE run_id = 'bad-step' AND key = 'charge'`)
	// A stored signal of another shape, in the sender's transaction.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := workflow.Signal(ctx, tx, "bad-signal", "approve", payApproval{true}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE relay_workflow_signals SET payload = '"text"' WHERE run_id = 'bad-signal'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"bad-step", "good", "bad-child", "bad-recorded"} {
		if err := workflow.Signal(ctx, pool, id, "approve", payApproval{true}); err != nil {
			t.Fatal(err)
		}
	}

	for id, want := range map[string]string{
		"bad-input":    "decode input",
		"bad-step":     `decode stored output of step "charge"`,
		"bad-child":    "decode output of child bad-child/kid",
		"bad-recorded": `decode recorded value "at"`,
	} {
		_, err := result[payCharge](t, pool, id)
		if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), id) {
			t.Errorf("%s: %v; want the run failed with %q", id, err, want)
		}
		var state, runErr string
		if err := pool.QueryRow(ctx, `SELECT state, coalesce(error, '') FROM relay_workflow_runs WHERE id = $1`, id).Scan(&state, &runErr); err != nil {
			t.Fatal(err)
		}
		if state != "failed" || !strings.Contains(runErr, want) {
			t.Errorf("%s: stored %s, %q; want failed with the decode error", id, state, runErr)
		}
		// Logged once its outcome committed, which Result may see first.
		b.waitFor(id+"'s outcome logged", func() bool { return logs.count(id) > 0 })
		// Its job ends with the run (its success is recorded just after
		// the run's outcome): nothing executes it again.
		b.waitFor(id+"'s job to end", func() bool {
			return b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
				WHERE r.id = $1 AND j.state = 'succeeded'`, id) == 1
		})
	}
	// The signal of another shape was set aside, not received: the run
	// waits on, and the next signal completes it.
	b.waitFor("bad-signal's signal set aside", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = 'bad-signal' AND consumed_by IS NULL
			AND decode_error LIKE '%decode signal approve%'`) == 1
	})
	if err := workflow.Signal(ctx, pool, "bad-signal", "approve", payApproval{true}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[payCharge](t, pool, "bad-signal"); err != nil || out.Amount != len("bad-signal") {
		t.Errorf("bad-signal: %v, %v; want completed after its signal was set aside", out, err)
	}
	for _, id := range []string{"bad-input", "bad-step", "bad-child", "bad-recorded"} {
		if n := logs.count(id); n != 1 {
			t.Errorf("%s: logged as ended %d times; want once", id, n)
		}
	}
	for _, id := range []string{"good", "quick"} {
		if out, err := result[payCharge](t, pool, id); err != nil || out.Amount != len(id) {
			t.Errorf("%s: %v, %v; want completed with %d", id, out, err, len(id))
		}
	}

	// A finished run's stored output and event, of another shape: the
	// reader asking for them fails, naming the run; the rows beside them
	// read as usual.
	b.exec(`UPDATE relay_workflow_runs SET output = '"text"' WHERE id = 'quick'`)
	b.exec(`UPDATE relay_workflow_events SET value = '"text"' WHERE run_id = 'quick'`)
	if _, err := result[payCharge](t, pool, "quick"); err == nil || !strings.Contains(err.Error(), "quick") || !strings.Contains(err.Error(), "decode output") {
		t.Errorf("Result of a stored output of another shape: %v; want the decode error naming the run", err)
	}
	if _, ok, err := workflow.GetEvent[payApproval](ctx, pool, "quick", "status"); !ok || err == nil || !strings.Contains(err.Error(), "quick") {
		t.Errorf("GetEvent of a stored value of another shape: %v, %v; want the decode error naming the run", ok, err)
	}
	if v, ok, err := workflow.GetEvent[payApproval](ctx, pool, "good", "status"); !ok || err != nil || !v.OK {
		t.Errorf("GetEvent beside it: %v, %v, %v", v, ok, err)
	}
	if out, err := result[payCharge](t, pool, "good"); err != nil || out.Amount != 4 {
		t.Errorf("Result beside it: %v, %v", out, err)
	}
}

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		b.t.Fatalf("%s: %v", sql, err)
	}
}

// A stored step time no Go time holds (a wake_at of -infinity, written
// behind the API) fails its own run only: each execution fails reading the
// run's history and is retried after Config.ExecutionRetry, as any
// crashed execution; when the run job's attempts are used up the run fails
// with the read error. A run beside it completes.
func TestInfiniteStoredTimeFailsItsRunOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "wait", func(wctx workflow.Context, _ int) (int, error) {
		if _, _, err := workflow.WaitSignal[int](wctx, "go", time.Hour); err != nil {
			return 0, err
		}
		return 1, nil
	})
	for _, id := range []string{"forever", "good"} {
		if _, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	b.start()
	b.waitFor("both runs to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE state = 'waiting'`) == 2
	})
	b.exec(`UPDATE relay_workflow_steps SET wake_at = '-infinity' WHERE run_id = 'forever'`)
	for _, id := range []string{"forever", "good"} {
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := result[int](t, b.pool, "forever"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "wake_at") {
		t.Errorf("forever: %v; want failed with the read error", err)
	}
	if out, err := result[int](t, b.pool, "good"); err != nil || out != 1 {
		t.Errorf("good: %v, %v; want completed", out, err)
	}
}

// A stored step output or run input that no longer decodes into the code's
// types fails that run alone, with the decoding error; the worker and the
// other runs go on.
func TestCorruptStoredRowsFailTheirRunAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "typed", func(wctx workflow.Context, in int) (int, error) {
		n, err := workflow.Step(wctx, "n", func(ctx context.Context) (int, error) { return in + 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		_, _, err = workflow.WaitSignal[int](wctx, "go", 0)
		return n, err
	})
	b.start()
	for _, id := range []string{"bad-output", "bad-input", "good"} {
		if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitFor("three runs waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE state = 'waiting'`) == 3
	})
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_steps SET output = '"two"' WHERE run_id = 'bad-output' AND key = 'n'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET input = '{"x": 1}' WHERE id = 'bad-input'`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"bad-output", "bad-input", "good"} {
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := result[int](t, b.pool, "bad-output"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `decode stored output of step "n"`) {
		t.Fatalf("bad-output: %v", err)
	}
	if _, err := result[int](t, b.pool, "bad-input"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "decode input") {
		t.Fatalf("bad-input: %v", err)
	}
	if out, err := result[int](t, b.pool, "good"); err != nil || out != 2 {
		t.Fatalf("good: %d, %v", out, err)
	}
}
