package workflowtest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
	"github.com/relayq/relay/workflowtest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A thirty-day durable sleep ends once the virtual clock has moved thirty
// days: Now on both sides of it, recorded by the engine, are thirty days
// apart, and the database's now() moved with it.
func TestThirtyDaySleep(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	type span struct{ Before, After, DBAfter time.Time }
	wf := workflow.MustRegister(env.Registry(), "month", func(wctx workflow.Context, _ struct{}) (span, error) {
		var s span
		s.Before = workflow.Now(wctx, "before")
		if err := workflow.Sleep(wctx, "wait", 30*24*time.Hour); err != nil {
			return s, err
		}
		s.After = workflow.Now(wctx, "after")
		var err error
		s.DBAfter, err = workflow.StepTx(wctx, "db-now", func(ctx context.Context, tx pgx.Tx) (time.Time, error) {
			var now time.Time
			err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now)
			return now, err
		}, nil)
		return s, err
	})
	began := time.Now()
	out, run := workflowtest.Run(env, wf, struct{}{}, nil)
	t.Logf("a 30-day sleep took %s of wall time", time.Since(began))
	if run.State != workflow.StateCompleted {
		t.Fatalf("run %s: %s", run.State, run.Error)
	}
	if d := out.After.Sub(out.Before); d < 30*24*time.Hour {
		t.Fatalf("Now moved %s across the sleep, want at least 30 days", d)
	}
	if d := out.DBAfter.Sub(out.Before); d < 30*24*time.Hour {
		t.Fatalf("the database's now() is %s past the first Now, want at least 30 days", d)
	}
}

// A step that fails twice is retried after its backoff in virtual time,
// its fake called three times; SleepUntil a date ends at that date.
func TestFakeStepRetriesAndSleepUntil(t *testing.T) {
	start := time.Date(2027, 1, 15, 9, 0, 0, 0, time.UTC)
	env := workflowtest.New(t, testdb.URL(t), &workflowtest.Config{Start: start})
	monthEnd := time.Date(2027, 1, 31, 2, 0, 0, 0, time.UTC)
	wf := workflow.MustRegister(env.Registry(), "provider", func(wctx workflow.Context, _ struct{}) (time.Time, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) {
			return "", errors.New("the real provider must not be called")
		}, &workflow.StepOpts{MaxAttempts: 5, Retry: core.Backoff{Base: time.Hour, Max: time.Hour}}); err != nil {
			return time.Time{}, err
		}
		if err := workflow.SleepUntil(wctx, "month-end", monthEnd); err != nil {
			return time.Time{}, err
		}
		return workflow.Now(wctx, "settled"), nil
	})
	failures := 2
	workflowtest.OnStep(env, "charge", func(ctx context.Context) (string, error) {
		if failures > 0 {
			failures--
			return "", errors.New("provider unavailable")
		}
		return "ch_1", nil
	})
	settled, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "r1"})
	if run.State != workflow.StateCompleted {
		t.Fatalf("run %s: %s", run.State, run.Error)
	}
	if n := env.Calls("r1", "charge"); n != 3 {
		t.Fatalf("charge called %d times, want 3 (two failures, one success)", n)
	}
	if run.Steps[0].Attempts != 3 || string(run.Steps[0].Output) != `"ch_1"` {
		t.Fatalf("charge step: %d attempts, output %s; want 3 and the fake's", run.Steps[0].Attempts, run.Steps[0].Output)
	}
	if settled.Before(monthEnd) || settled.After(monthEnd.Add(time.Minute)) {
		t.Fatalf("settled at %s, want the month's end %s", settled, monthEnd)
	}
}

// A signal sent at a virtual time reaches a wait with a longer timeout; a
// wait that no signal reaches times out when its timeout has passed.
func TestSignalsAtVirtualTimes(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	type result struct {
		Got    bool
		Waited time.Duration
	}
	wf := workflow.MustRegister(env.Registry(), "confirm", func(wctx workflow.Context, _ struct{}) (result, error) {
		before := workflow.Now(wctx, "before")
		_, ok, err := workflow.WaitSignal[string](wctx, "confirmed", 48*time.Hour)
		return result{Got: ok, Waited: workflow.Now(wctx, "after").Sub(before)}, err
	})
	env.SignalAfter(24*time.Hour, "signalled", "confirmed", "yes")
	got, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "signalled"})
	if run.State != workflow.StateCompleted || !got.Got || got.Waited < 23*time.Hour || got.Waited >= 48*time.Hour {
		t.Fatalf("signalled run %s: %+v, want the signal after 24h", run.State, got)
	}
	got, run = workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "silent"})
	if run.State != workflow.StateCompleted || got.Got || got.Waited < 48*time.Hour {
		t.Fatalf("silent run %s: %+v, want a timeout after 48h", run.State, got)
	}
}

// A worker killed between two checkpoints: a StepTx before the kill is not
// repeated (its effect is written once), an inline step whose output was
// not yet checkpointed when the worker died runs again.
func TestCrashBetweenCheckpoints(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	if _, err := env.Pool().Exec(context.Background(), `CREATE TABLE charges (run text)`); err != nil {
		t.Fatal(err)
	}
	wf := workflow.MustRegister(env.Registry(), "pay", func(wctx workflow.Context, _ struct{}) (string, error) {
		if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1)`, wctx.RunID())
			return err == nil, err
		}, nil); err != nil {
			return "", err
		}
		if _, err := workflow.Step(wctx, "email", func(ctx context.Context) (bool, error) { return true, nil }, nil); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "receipt", func(ctx context.Context) (string, error) { return "done", nil }, nil)
	})
	env.CrashBefore("email") // after the charge's transaction committed
	env.CrashAfter("email")  // after the email went, before its checkpoint
	out, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "p1"})
	if run.State != workflow.StateCompleted || out != "done" {
		t.Fatalf("run %s (%q): %s", run.State, out, run.Error)
	}
	var charges int
	if err := env.Pool().QueryRow(context.Background(), `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if charges != 1 || env.Calls("p1", "charge") != 1 {
		t.Fatalf("%d charges written, charge called %d times; want 1 and 1", charges, env.Calls("p1", "charge"))
	}
	if n := env.Calls("p1", "email"); n != 2 {
		t.Fatalf("email called %d times, want 2 (the crash came before its checkpoint)", n)
	}
	job, err := core.JobGet(context.Background(), env.Pool(), run.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.Attempt != 3 {
		t.Fatalf("the run's job took %d attempts, want 3 (two crashed)", job.Attempt)
	}
}

// A child replaced by a fake workflow is still a run of its own, which the
// parent starts, waits for and collects; a failing fake child makes the
// parent compensate.
func TestFakeChildAndCompensations(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	email := workflow.MustRegister(env.Registry(), "email", func(wctx workflow.Context, to string) (string, error) {
		return "", errors.New("the real email workflow must not run")
	})
	wf := workflow.MustRegister(env.Registry(), "order", func(wctx workflow.Context, to string) (string, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
		return workflow.Child(wctx, "email", email, to, nil).Get(wctx)
	})
	workflowtest.OnWorkflow(env, "email", func(wctx workflow.Context, to string) (string, error) {
		if to == "bounce@example.com" {
			return "", errors.New("mailbox full")
		}
		return "msg-" + to, nil
	})
	out, run := workflowtest.Run(env, wf, "a@example.com", &workflow.StartOpts{ID: "o1"})
	if run.State != workflow.StateCompleted || out != "msg-a@example.com" {
		t.Fatalf("run %s (%q): %s", run.State, out, run.Error)
	}
	_, run = workflowtest.Run(env, wf, "bounce@example.com", &workflow.StartOpts{ID: "o2"})
	if run.State != workflow.StateCompensated {
		t.Fatalf("run %s, want compensated: %s", run.State, run.Error)
	}
	comps := env.Compensations("o2")
	if len(comps) != 1 || comps[0].Key != "compensate:refund" || comps[0].State != "completed" {
		t.Fatalf("compensations %+v, want the refund completed", comps)
	}
}

// A select's timer is a timer of the environment: with no signal the
// 48-hour timer wins once the clock has moved 48 hours; a signal sent a
// day in wins over it.
func TestSelectTimerInVirtualTime(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	type choice struct {
		Index  int
		Waited time.Duration
	}
	wf := workflow.MustRegister(env.Registry(), "await", func(wctx workflow.Context, _ struct{}) (choice, error) {
		before := workflow.Now(wctx, "before")
		i, err := workflow.Select(wctx, "await-customer", workflow.OnSignal[string]("confirm"), workflow.OnTimer(48*time.Hour))
		return choice{Index: i, Waited: workflow.Now(wctx, "after").Sub(before)}, err
	})
	got, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "silent"})
	if run.State != workflow.StateCompleted || got.Index != 1 || got.Waited < 48*time.Hour {
		t.Fatalf("silent: %s %+v, want the timer after 48h", run.State, got)
	}
	env.SignalAfter(24*time.Hour, "confirmed", "confirm", "yes")
	got, run = workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "confirmed"})
	if run.State != workflow.StateCompleted || got.Index != 0 || got.Waited >= 48*time.Hour {
		t.Fatalf("confirmed: %s %+v, want the signal within the day", run.State, got)
	}
}

// fatalRecorder is a testing.TB whose Fatal records the message and ends
// the calling goroutine, as testing's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *fatalRecorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// Wait fails, saying why, for a run that nothing will ever wake (a signal
// wait without timeout, no event to send it) and for a run on a queue the
// environment does not serve, instead of hanging.
func TestWaitSaysWhyARunCannotEnd(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	env := workflowtest.New(rec, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "stuck", func(wctx workflow.Context, _ struct{}) (string, error) {
		v, _, err := workflow.WaitSignal[string](wctx, "never", 0)
		return v, err
	})
	for id, queue := range map[string]string{"stuck": "", "elsewhere": "other"} {
		rec.msg = ""
		done := make(chan struct{})
		go func() {
			defer close(done)
			workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: id, Queue: queue})
		}()
		<-done
		want := []string{"run " + id + " cannot end", "no timer or event of the environment will wake a run in flight", "run " + id + " (stuck)"}
		if queue != "" {
			want = append(want, `on queue "other", a queue the environment does not serve`)
		} else {
			want = append(want, "last step: signal signal:never#1 (waiting)")
		}
		for _, w := range want {
			if !strings.Contains(rec.msg, w) {
				t.Errorf("run %s: %q lacks %q", id, rec.msg, w)
			}
		}
	}
}

// A run's execution timeout is a timer of the environment: a run waiting
// without deadline for a signal that never comes fails at its 7-day
// timeout, its compensation run, once the clock has moved 7 days.
func TestExecutionTimeoutInVirtualTime(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "approval", func(wctx workflow.Context, _ struct{}) (string, error) {
		if _, err := workflow.Step(wctx, "reserve", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(ctx context.Context) error { return nil })
		v, _, err := workflow.WaitSignal[string](wctx, "approved", 0)
		return v, err
	})
	start := env.Now()
	_, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "a1", ExecutionTimeout: 7 * 24 * time.Hour})
	if run.State == workflow.StateCompleted || !strings.Contains(run.Error, workflow.ErrRunTimedOut.Error()) {
		t.Fatalf("run %s: %q, want it timed out", run.State, run.Error)
	}
	if waited := env.Now().Sub(start); waited < 7*24*time.Hour {
		t.Fatalf("timed out %s after its start, before its 7 days", waited)
	}
	if comps := env.Compensations("a1"); len(comps) != 1 || comps[0].State != "completed" {
		t.Fatalf("compensations %+v, want the release", comps)
	}
}

// CreateDatabase makes a database of the test's own on the server, which
// New migrates, and drops it when the test ends.
func TestCreateDatabase(t *testing.T) {
	server := testdb.URL(t)
	var name string
	t.Run("env", func(t *testing.T) {
		url := workflowtest.CreateDatabase(t, server)
		env := workflowtest.New(t, url, nil)
		if err := env.Pool().QueryRow(context.Background(), `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, "relay_wftest_") {
			t.Fatalf("database %q", name)
		}
		wf := workflow.MustRegister(env.Registry(), "one", func(wctx workflow.Context, _ struct{}) (int, error) { return 1, nil })
		if out, run := workflowtest.Run(env, wf, struct{}{}, nil); out != 1 || run.State != workflow.StateCompleted {
			t.Fatalf("run %s %d", run.State, out)
		}
	})
	if n := testdb.Count(t, testdb.New(t), `SELECT count(*) FROM pg_database WHERE datname = $1`, name); n != 0 {
		t.Fatalf("database %s left behind", name)
	}
}

// A crash before a sleep and before a signal wait: the inline step before
// them, its checkpoint deferred, was written first and is not repeated.
func TestCrashBeforeAWait(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "waits", func(wctx workflow.Context, _ struct{}) (string, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if err := workflow.Sleep(wctx, "cool-off", time.Hour); err != nil {
			return "", err
		}
		if _, err := workflow.Step(wctx, "ask", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		v, _, err := workflow.WaitSignal[string](wctx, "confirmed", 24*time.Hour)
		return v, err
	})
	env.CrashBefore("cool-off")
	env.CrashBefore("signal:confirmed#1")
	env.SignalAfter(2*time.Hour, "w1", "confirmed", "yes")
	out, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "w1"})
	if run.State != workflow.StateCompleted || out != "yes" {
		t.Fatalf("run %s %q: %s", run.State, out, run.Error)
	}
	if env.Calls("w1", "charge") != 1 || env.Calls("w1", "ask") != 1 {
		t.Fatalf("charge called %d times, ask %d; want each once", env.Calls("w1", "charge"), env.Calls("w1", "ask"))
	}
	job, err := core.JobGet(context.Background(), env.Pool(), run.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.Attempt != 3 {
		t.Fatalf("the run's job took %d attempts, want 3 (two crashed)", job.Attempt)
	}
}

// AdvanceBy runs what comes due on the way and stops at the time asked:
// a day in, the reminder has gone and the run still waits; three days in,
// it has timed out.
func TestAdvanceBy(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "remind", func(wctx workflow.Context, _ struct{}) (bool, error) {
		if err := workflow.Sleep(wctx, "a-while", 12*time.Hour); err != nil {
			return false, err
		}
		if _, err := workflow.Step(wctx, "reminder", func(ctx context.Context) (bool, error) { return true, nil }, nil); err != nil {
			return false, err
		}
		_, ok, err := workflow.WaitSignal[string](wctx, "confirmed", 48*time.Hour)
		return ok, err
	})
	if _, err := workflow.Start(context.Background(), env.Pool(), wf, struct{}{}, &workflow.StartOpts{ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	start := env.Now()
	env.AdvanceBy(24 * time.Hour)
	run, err := workflow.Get(context.Background(), env.Pool(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if run.State != workflow.StateRunning || env.Calls("r1", "reminder") != 1 || run.Steps[len(run.Steps)-1].State != "waiting" {
		t.Fatalf("a day in: %s, reminder called %d times, steps %+v", run.State, env.Calls("r1", "reminder"), run.Steps)
	}
	if d := env.Now().Sub(start); d < 24*time.Hour || d > 25*time.Hour {
		t.Fatalf("the clock moved %s, want a day", d)
	}
	env.AdvanceBy(48 * time.Hour)
	if run = env.Wait("r1"); run.State != workflow.StateCompleted || string(run.Output) != "false" {
		t.Fatalf("three days in: %s %s", run.State, run.Output)
	}
}
