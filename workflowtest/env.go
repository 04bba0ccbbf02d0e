// Package workflowtest runs workflows inside go test, against real
// PostgreSQL, in virtual time: durable sleeps, SleepUntil, signal
// timeouts, step retry backoffs and execution retries are skipped forward
// whenever every run is waiting on a timer, so a flow that sleeps thirty
// days finishes in milliseconds while the engine runs the same code paths
// (the same statements, the same core.Client, the same job table) as in
// production.
//
//	env := workflowtest.New(t, databaseURL, nil) // a database of the test's own
//	pay := workflow.MustRegister(env.Registry(), "payment", payment)
//	workflowtest.OnStep(env, "charge", func(ctx context.Context) (Charge, error) { return Charge{ID: "ch_1"}, nil })
//	env.CrashAfter("charge") // the worker dies once, right after charging
//	out, run := workflowtest.Run(env, pay, order, nil)
//	if run.State != workflow.StateCompleted { … }
//
// The test reads the run's outcome, output and steps (workflow.Run),
// its compensations (Compensations), its exported history (History) and
// how many times each step's function was called (Calls); signals and
// updates are sent at virtual times (SignalAt, UpdateAt, UpdateAnswer).
package workflowtest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/wfhook"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/workflow"
)

// Config configures an Env. The zero value (or nil) is usable.
type Config struct {
	// Queues are the queues whose runs the environment executes, with how
	// many execute at once on each. Default {"default": 4}. A run on
	// another queue never executes (Wait says so).
	Queues map[string]int
	// Start is where the virtual clock starts. Default: the real clock at
	// New. It is never before that: the database's clock only moves forward.
	Start time.Time
	// Timeout bounds each Wait (and Run) in wall time. Default 1 minute.
	Timeout time.Duration
	// Logger receives the registry's and the worker's logs. Default
	// slog.Default().
	Logger *slog.Logger
	// Workflow configures the registry (its Logger is Logger when unset).
	Workflow workflow.Config
}

// Env is a test environment: a registry and a worker on a database of the
// test's own, with a virtual clock. Make one per test with New; it is
// closed when the test ends.
type Env struct {
	t       testing.TB
	cfg     Config
	pool    *pgxpool.Pool
	reg     *workflow.Registry
	queues  []string
	offset  atomic.Int64 // the virtual clock's lead on the real one, in ns
	startMu sync.Mutex
	client  *core.Client

	mu        sync.Mutex
	fakes     map[string]func(ctx context.Context) ([]byte, error)
	workflows map[string]any
	crashes   map[crashPoint]int
	calls     map[[2]string]int
	events    []*event // by time
}

type crashPoint struct {
	key   string
	point wfhook.Point
}

// event is something the test asked to happen at a virtual time.
type event struct {
	at   time.Time
	what string
	do   func(ctx context.Context, pool *pgxpool.Pool) error
}

// New makes an environment on the database databaseURL names, which must
// be the test's own (the clock is the database's: two environments on one
// database would move each other's time): it is migrated, and gets the
// virtual clock's schema (relay_virtual_time). Everything the environment
// closes when the test ends.
func New(t testing.TB, databaseURL string, cfg *Config) *Env {
	t.Helper()
	e := &Env{t: t, fakes: map[string]func(ctx context.Context) ([]byte, error){}, workflows: map[string]any{},
		crashes: map[crashPoint]int{}, calls: map[[2]string]int{}}
	if cfg != nil {
		e.cfg = *cfg
	}
	if len(e.cfg.Queues) == 0 {
		e.cfg.Queues = map[string]int{"default": 4}
	}
	e.queues = slices.Sorted(maps.Keys(e.cfg.Queues))
	e.cfg.Timeout = cmp.Or(e.cfg.Timeout, time.Minute)
	e.cfg.Logger = cmp.Or(e.cfg.Logger, slog.Default())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	admin, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		t.Fatalf("workflowtest: connect: %v", err)
	}
	defer admin.Close()
	if _, err := migrations.Migrate(ctx, admin); err != nil {
		t.Fatalf("workflowtest: migrate: %v", err)
	}
	path, err := installClock(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("workflowtest: %v", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = path
	if e.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		t.Fatalf("workflowtest: connect: %v", err)
	}
	if !e.cfg.Start.IsZero() {
		e.setClock(ctx, e.cfg.Start)
	} else {
		e.setClock(ctx, time.Now())
	}
	wc := e.cfg.Workflow
	wc.Logger = cmp.Or(wc.Logger, e.cfg.Logger)
	e.reg = workflow.NewRegistry(e.pool, &wc)
	t.Cleanup(e.close)
	return e
}

// Pool is the environment's pool: its now() is the virtual clock. Give it
// to the code under test (a StepTx's queries, Start, Signal).
func (e *Env) Pool() *pgxpool.Pool { return e.pool }

// Registry is the environment's registry: register the workflows under
// test in it before the first Run or Wait.
func (e *Env) Registry() *workflow.Registry { return e.reg }

// Now is the virtual clock.
func (e *Env) Now() time.Time { return time.Now().Add(time.Duration(e.offset.Load())).UTC() }

func (e *Env) setClock(ctx context.Context, at time.Time) {
	d, err := setClock(ctx, e.pool, at)
	if err != nil {
		e.t.Fatal(err)
	}
	e.offset.Store(int64(d))
}

// OnStep replaces the function of every step keyed key (Step, StepTx, Go,
// or a compensation, "compensate:<key>") with fn, in every run of the
// environment: the step is checkpointed as usual with fn's output, which
// must decode into the step's type (a StepTx's transaction still commits
// the checkpoint; fn gets none). fn's error fails the attempt as the
// step's own would (retried per the step's options, in virtual time).
func OnStep[T any](e *Env, key string, fn func(ctx context.Context) (T, error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fakes[key] = func(ctx context.Context) ([]byte, error) {
		out, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
}

// OnWorkflow runs fn instead of the workflow registered as name, for every
// run of it the environment executes: a child's fake (the child is still a
// run of its own, started, waited for and collected as in production). fn's
// input and output must encode as the real workflow's do.
func OnWorkflow[In, Out any](e *Env, name string, fn func(wctx workflow.Context, in In) (Out, error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.workflows[name] = func(wctx workflow.Context, input []byte) ([]byte, error) {
		var in In
		if err := json.Unmarshal(input, &in); err != nil {
			return nil, fmt.Errorf("workflowtest: decode input of %s run %s into %T: %w", name, wctx.RunID(), in, err)
		}
		out, err := fn(wctx, in)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
}

// CrashBefore makes the next execution that reaches the step keyed key
// die there, once, as a worker killed at that point would: after every
// earlier checkpoint committed, before the step's function runs. Any
// primitive's key may be named, as history stores it: a sleep's, a
// select's, a child's or a value's key, or "signal:<name>#<n>" (the n-th
// wait for that signal); the crash is then before the primitive records
// anything new. The
// execution writes nothing more and the core retries the run's job, an
// attempt spent as for a crash; the next execution replays the history.
func (e *Env) CrashBefore(key string) { e.crash(key, wfhook.BeforeStep) }

// CrashAfter is CrashBefore right after the step's function returned,
// before its output is checkpointed: an inline step (Step, Go) then runs
// again in the next execution (steps are at-least-once), a StepTx, whose
// checkpoint committed with its transaction, does not.
func (e *Env) CrashAfter(key string) { e.crash(key, wfhook.AfterStep) }

func (e *Env) crash(key string, p wfhook.Point) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.crashes[crashPoint{key, p}]++
}

// Calls is how many times the function of step key of run id was called
// (its fake's, when OnStep replaced it) in this environment, across the
// run's executions: a step that a crash or a replay must not repeat is
// called once.
func (e *Env) Calls(id, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[[2]string{id, key}]
}

// SignalAt sends the signal name with payload to run id when the virtual
// clock reaches at (at once if it has): the environment's clock stops
// there as at a timer.
func (e *Env) SignalAt(at time.Time, id, name string, payload any) {
	e.At(at, fmt.Sprintf("signal %q to run %s", name, id), func(ctx context.Context, pool *pgxpool.Pool) error {
		return workflow.Signal(ctx, pool, id, name, payload)
	})
}

// SignalAfter is SignalAt d after the virtual clock's present.
func (e *Env) SignalAfter(d time.Duration, id, name string, payload any) {
	e.SignalAt(e.Now().Add(d), id, name, payload)
}

// At calls do when the virtual clock reaches at, with the environment's
// pool; what names it in failures. An error fails the test.
func (e *Env) At(at time.Time, what string, do func(ctx context.Context, pool *pgxpool.Pool) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, &event{at: at, what: what, do: do})
	slices.SortStableFunc(e.events, func(a, b *event) int { return a.at.Compare(b.at) })
}

// Run starts a run of wf with in (opts as workflow.Start's) and waits for
// it to end (Wait). It returns the run's output (the zero Out unless it
// completed) and the run.
func Run[In, Out any](e *Env, wf *workflow.Workflow[In, Out], in In, opts *workflow.StartOpts) (Out, *workflow.Run) {
	e.t.Helper()
	var out Out
	h, err := workflow.Start(context.Background(), e.pool, wf, in, opts)
	if err != nil {
		e.t.Fatalf("workflowtest: start %s: %v", wf.Name(), err)
		return out, nil
	}
	run := e.Wait(h.ID)
	if run.State == workflow.StateCompleted {
		if err := json.Unmarshal(run.Output, &out); err != nil {
			e.t.Fatalf("workflowtest: decode the output of run %s into %T: %v", h.ID, out, err)
		}
	}
	return out, run
}

// Compensations are the compensation steps of run id, in the order they
// ran (newest registration first).
func (e *Env) Compensations(id string) []workflow.StepInfo {
	e.t.Helper()
	run, err := workflow.Get(context.Background(), e.pool, id)
	if err != nil {
		e.t.Fatalf("workflowtest: %v", err)
	}
	var comps []workflow.StepInfo
	for _, s := range run.Steps {
		if strings.HasPrefix(s.Key, "compensate:") {
			comps = append(comps, s)
		}
	}
	return comps
}

// History is run id's exported history (workflow.ReadHistory), for
// workflow.Replay.
func (e *Env) History(id string) *workflow.History {
	e.t.Helper()
	h, err := workflow.ReadHistory(context.Background(), e.pool, id)
	if err != nil {
		e.t.Fatalf("workflowtest: %v", err)
	}
	return h
}

// hooks are the environment's ways into the engine (internal/wfhook).
func (e *Env) hooks() *wfhook.Hooks {
	return &wfhook.Hooks{
		Now: e.Now,
		Step: func(runID, key string) func(ctx context.Context) ([]byte, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.calls[[2]string{runID, key}]++
			return e.fakes[key]
		},
		Workflow: func(name string) any {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.workflows[name]
		},
		Crash: func(_, key string, p wfhook.Point) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			c := crashPoint{key, p}
			if e.crashes[c] == 0 {
				return false
			}
			e.crashes[c]--
			return true
		},
	}
}

// start starts the environment's worker, once.
func (e *Env) start() {
	e.startMu.Lock()
	defer e.startMu.Unlock()
	if e.client != nil {
		return
	}
	ws := core.NewWorkers()
	if err := e.reg.AddWorkers(ws); err != nil {
		e.t.Fatalf("workflowtest: %v", err)
	}
	queues := map[string]core.QueueConfig{}
	for q, n := range e.cfg.Queues {
		queues[q] = core.QueueConfig{MaxWorkers: max(n, 1)}
	}
	c, err := core.NewClient(e.pool, &core.Config{Workers: ws, Queues: queues, Logger: e.cfg.Logger})
	if err != nil {
		e.t.Fatalf("workflowtest: %v", err)
	}
	if err := c.Start(wfhook.With(context.Background(), e.hooks())); err != nil {
		e.t.Fatalf("workflowtest: start the worker: %v", err)
	}
	e.client = c
}

func (e *Env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.startMu.Lock()
	c := e.client
	e.startMu.Unlock()
	if c != nil {
		if err := c.Stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			e.t.Errorf("workflowtest: stop the worker: %v", err)
		}
	}
	e.reg.Close()
	e.pool.Close()
}
