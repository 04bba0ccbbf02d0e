package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The workflow workloads: a chain of three no-op steps, run by a durable
// workflow engine (Relay's workflow package, DBOS Transact Go), either
// queued up front and drained, or started by callers that wait for each
// result.

// Shape is the workflow a workload runs.
type Shape string

const (
	// ShapeChain is three no-op steps.
	ShapeChain Shape = "chain"
	// ShapeSleep is the chain with a durable Sleep(0) between steps.
	ShapeSleep Shape = "sleep"
	// ShapeChild is the chain with each step a child run (of one no-op
	// step) that the parent waits for.
	ShapeChild Shape = "child"
)

// ChainSteps is the number of steps in every shape.
const ChainSteps = 3

// ParseShape checks a shape name.
func ParseShape(s string) (Shape, error) {
	switch Shape(s) {
	case ShapeChain, ShapeSleep, ShapeChild:
		return Shape(s), nil
	}
	return "", fmt.Errorf("bench: unknown workflow shape %q (chain, sleep, child)", s)
}

// WorkflowSpec is one workflow measurement.
type WorkflowSpec struct {
	// Mode is "queued" (Runs started up front, then drained) or "latency"
	// (Callers each start a run and wait for its result, for Duration).
	Mode  string `json:"mode"`
	Shape Shape  `json:"shape"`
	// URL is the database; the engine keeps its tables in Schema (created
	// afresh by Open).
	URL    string `json:"url"`
	Schema string `json:"schema"`

	Runs     int           `json:"runs,omitempty"`
	Callers  int           `json:"callers,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	// Warmup is how long latency callers run before recording.
	Warmup time.Duration `json:"warmup,omitempty"`
	// Workers is how many runs an engine executes at once in its worker
	// (queued mode, and Relay's executions in latency mode).
	Workers int `json:"workers"`
	// Poll is the queue polling interval, for engines that poll.
	Poll time.Duration `json:"poll,omitempty"`
	// Starters is how many goroutines start the queued runs. Default 16.
	Starters int `json:"starters,omitempty"`
	// Batch is, in mode "starts", how many runs an engine that starts
	// batches (BatchStarter) starts per transaction.
	Batch int `json:"batch,omitempty"`
	// Hops, in mode "latency", has an engine that is a HopReporter time
	// each hop of every call (a diagnostic: off in a measurement of
	// record).
	Hops bool `json:"hops,omitempty"`
}

// BatchStarter is a WorkflowEngine that starts runs in batches, for mode
// "starts".
type BatchStarter interface {
	// StartBatch starts n runs of shape in one transaction.
	StartBatch(ctx context.Context, shape Shape, n int) error
}

// WorkflowSystem is a durable-workflow engine under test.
type WorkflowSystem interface {
	// Name is a short lowercase name ("relay", "dbos").
	Name() string
	// Describe says how the engine is configured for spec.
	Describe(spec WorkflowSpec) string
	// Open creates the engine's tables afresh in spec.Schema and returns
	// an engine that has not started executing anything.
	Open(ctx context.Context, spec WorkflowSpec) (WorkflowEngine, error)
}

// WorkflowEngine is an open engine.
type WorkflowEngine interface {
	// Enqueue starts one run of shape on the engine's queue, to be executed
	// by its workers (not by the caller), in its own transaction.
	Enqueue(ctx context.Context, shape Shape) error
	// Serve starts executing: the workers of the queue, and whatever Call
	// needs.
	Serve(ctx context.Context) error
	// Progress is how many top-level runs' functions have returned in this
	// process (cheap; the harness confirms the end with Finished).
	Progress() int64
	// Finished counts top-level runs recorded as finished successfully.
	Finished(ctx context.Context) (int64, error)
	// Call starts one run of shape and waits for its result.
	Call(ctx context.Context, shape Shape) error
	// Pool is a pool on the engine's database, for the harness's own
	// queries (PostgreSQL CPU).
	Pool() *pgxpool.Pool
	// Statements counts the statements the engine's executions and callers
	// have sent so far (BEGIN and COMMIT included), or -1.
	Statements() int64
	// Close stops everything the engine started.
	Close() error
}

// WorkflowResult is one workflow measurement's figures.
type WorkflowResult struct {
	System string       `json:"system"`
	Spec   WorkflowSpec `json:"spec"`

	Runs          int     `json:"runs"`
	StartedPerSec float64 `json:"started_per_s"` // queued: how fast the runs were started
	RunsPerSec    float64 `json:"runs_per_s"`
	StepsPerSec   float64 `json:"steps_per_s"`

	P50 time.Duration `json:"p50"` // latency: start → result
	P95 time.Duration `json:"p95"`
	P99 time.Duration `json:"p99"`

	Elapsed time.Duration `json:"elapsed"`
	PGCPU   time.Duration `json:"pg_cpu"` // -1: unknown
	// ProcessCPU is the CPU the measuring process used (queued mode: the
	// engine's executions, in this process, and the harness's wait), -1
	// when unknown.
	ProcessCPU time.Duration `json:"process_cpu"`
	// StatementsPerRun is the statements sent per run measured (-1:
	// unknown): the round trips each run costs.
	StatementsPerRun float64 `json:"statements_per_run"`
	// Hops is, with WorkflowSpec.Hops, where the calls' time went.
	Hops []HopFigure `json:"hops,omitempty"`
}

// Line is the machine-readable summary.
func (r WorkflowResult) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bench: mode=workflow-%s system=%s shape=%s runs=%d", r.Spec.Mode, r.System, r.Spec.Shape, r.Runs)
	switch r.Spec.Mode {
	case "queued":
		fmt.Fprintf(&b, " workers=%d started_per_s=%.0f", r.Spec.Workers, r.StartedPerSec)
	case "starts":
		fmt.Fprintf(&b, " batch=%d started_per_s=%.0f", r.Spec.Batch, r.StartedPerSec)
	default:
		fmt.Fprintf(&b, " callers=%d", r.Spec.Callers)
	}
	fmt.Fprintf(&b, " runs_per_s=%.0f steps_per_s=%.0f", r.RunsPerSec, r.StepsPerSec)
	if r.Spec.Mode == "latency" {
		fmt.Fprintf(&b, " p50_ms=%s p95_ms=%s p99_ms=%s", ms(r.P50), ms(r.P95), ms(r.P99))
	}
	pg := "n/a"
	if r.PGCPU >= 0 && r.Runs > 0 {
		pg = ms(r.PGCPU * 1000 / time.Duration(r.Runs))
	}
	fmt.Fprintf(&b, " pg_cpu_ms_per_1k=%s", pg)
	if r.ProcessCPU > 0 && r.Runs > 0 {
		fmt.Fprintf(&b, " process_cpu_ms_per_1k=%s", ms(r.ProcessCPU*1000/time.Duration(r.Runs)))
	}
	fmt.Fprintf(&b, " statements_per_run=%.3g elapsed=%s", r.StatementsPerRun, r.Elapsed.Round(time.Millisecond))
	return b.String()
}

// RunWorkflow opens sys and runs one measurement.
func RunWorkflow(ctx context.Context, sys WorkflowSystem, spec WorkflowSpec) (res WorkflowResult, err error) {
	if spec.Shape == "" {
		spec.Shape = ShapeChain
	}
	res = WorkflowResult{System: sys.Name(), Spec: spec, PGCPU: -1, ProcessCPU: -1}
	eng, err := sys.Open(ctx, spec)
	if err != nil {
		return res, fmt.Errorf("%s: open: %w", sys.Name(), err)
	}
	defer func() {
		if cerr := eng.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: close: %w", sys.Name(), cerr)
		}
	}()
	switch spec.Mode {
	case "queued":
		return runQueued(ctx, eng, res)
	case "latency":
		return runLatency(ctx, eng, res)
	case "starts":
		return runStarts(ctx, eng, res)
	}
	return res, fmt.Errorf("bench: unknown workflow mode %q", spec.Mode)
}

func runQueued(ctx context.Context, eng WorkflowEngine, res WorkflowResult) (WorkflowResult, error) {
	spec := res.Spec
	starters := spec.Starters
	if starters <= 0 {
		starters = 16
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	began := time.Now()
	for range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(spec.Runs) {
				if err := eng.Enqueue(ctx, spec.Shape); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return res, fmt.Errorf("start runs: %w", firstErr)
	}
	res.StartedPerSec = float64(spec.Runs) / time.Since(began).Seconds()

	cpu0 := pgCPU(ctx, eng.Pool())
	self0 := processCPU()
	st0 := eng.Statements()
	began = time.Now()
	if err := eng.Serve(ctx); err != nil {
		return res, fmt.Errorf("serve: %w", err)
	}
	lastPrint := began
	for {
		// The engine's in-process count is cheap; the table confirms.
		if eng.Progress() >= int64(spec.Runs) {
			n, err := eng.Finished(ctx)
			if err != nil {
				return res, err
			}
			if n >= int64(spec.Runs) {
				break
			}
		}
		if time.Since(lastPrint) >= 2*time.Second {
			lastPrint = time.Now()
			fmt.Printf("  %s: %d/%d runs (%.0f/s so far)\n", res.System, eng.Progress(), spec.Runs, float64(eng.Progress())/time.Since(began).Seconds())
		}
		if time.Since(began) > 10*time.Minute {
			return res, fmt.Errorf("%d of %d runs finished after 10 minutes", eng.Progress(), spec.Runs)
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(began)
	if self0 >= 0 {
		res.ProcessCPU = processCPU() - self0
	}
	res.PGCPU = cpuSince(ctx, eng.Pool(), cpu0)
	res.Runs = spec.Runs
	res.StatementsPerRun = perRun(st0, eng.Statements(), spec.Runs)
	res.RunsPerSec = float64(spec.Runs) / res.Elapsed.Seconds()
	res.StepsPerSec = res.RunsPerSec * ChainSteps
	return res, nil
}

// runStarts measures starting spec.Runs runs, nothing executing them: by
// Starters goroutines, each start its own transaction (Enqueue), or, for a
// BatchStarter and spec.Batch > 0, spec.Batch runs per transaction.
func runStarts(ctx context.Context, eng WorkflowEngine, res WorkflowResult) (WorkflowResult, error) {
	spec := res.Spec
	starters := spec.Starters
	if starters <= 0 {
		starters = 16
	}
	bs, batched := eng.(BatchStarter)
	per := 1
	if batched && spec.Batch > 0 {
		per = spec.Batch
	}
	calls := (spec.Runs + per - 1) / per
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	cpu0 := pgCPU(ctx, eng.Pool())
	st0 := eng.Statements()
	began := time.Now()
	for range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(calls) {
					return
				}
				var err error
				if per > 1 {
					err = bs.StartBatch(ctx, spec.Shape, min(per, spec.Runs-int(i-1)*per))
				} else {
					err = eng.Enqueue(ctx, spec.Shape)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return res, fmt.Errorf("start runs: %w", firstErr)
	}
	res.Elapsed = time.Since(began)
	res.PGCPU = cpuSince(ctx, eng.Pool(), cpu0)
	res.Runs = spec.Runs
	res.StatementsPerRun = perRun(st0, eng.Statements(), spec.Runs)
	res.StartedPerSec = float64(spec.Runs) / res.Elapsed.Seconds()
	return res, nil
}

func runLatency(ctx context.Context, eng WorkflowEngine, res WorkflowResult) (WorkflowResult, error) {
	spec := res.Spec
	if spec.Callers <= 0 || spec.Duration <= 0 {
		return res, errors.New("latency: callers and duration must be positive")
	}
	if err := eng.Serve(ctx); err != nil {
		return res, fmt.Errorf("serve: %w", err)
	}
	var mu sync.Mutex
	var hist Histogram
	var firstErr error
	var recording atomic.Bool
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range spec.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped.Load() && ctx.Err() == nil {
				start := time.Now()
				err := eng.Call(ctx, spec.Shape)
				d := time.Since(start)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && recording.Load() && !stopped.Load() {
					hist.Record(d)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	if err := sleepCtx(ctx, spec.Warmup); err != nil {
		return res, err
	}
	cpu0 := pgCPU(ctx, eng.Pool())
	st0 := eng.Statements()
	recording.Store(true)
	began := time.Now()
	sleepCtx(ctx, spec.Duration) //nolint:errcheck
	mu.Lock()
	stopped.Store(true)
	ended := time.Now()
	res.Elapsed = ended.Sub(began)
	n := hist.Count()
	st1 := eng.Statements()
	mu.Unlock()
	res.PGCPU = cpuSince(ctx, eng.Pool(), cpu0)
	wg.Wait()
	if firstErr != nil {
		return res, fmt.Errorf("call: %w", firstErr)
	}
	res.Runs = int(n)
	res.StatementsPerRun = perRun(st0, st1, int(n))
	res.RunsPerSec = float64(n) / res.Elapsed.Seconds()
	res.StepsPerSec = res.RunsPerSec * ChainSteps
	res.P50, res.P95, res.P99 = hist.Quantile(0.5), hist.Quantile(0.95), hist.Quantile(0.99)
	if hr, ok := eng.(HopReporter); ok && spec.Hops {
		hops, err := hr.Hops(ctx, began, ended)
		if err != nil {
			return res, fmt.Errorf("hops: %w", err)
		}
		res.Hops = hops
	}
	return res, nil
}

// WorkflowChildArgs renders spec for a measurement process (see
// RunWorkflowChild).
func WorkflowChildArgs(system string, spec WorkflowSpec) []string {
	b, _ := json.Marshal(spec)
	return []string{"--system", system, "--spec", string(b)}
}

// RunWorkflowChild is the body of a measurement process: it runs the spec
// it is given with the named system and prints the result as its last line,
// "wfresult {json}".
func RunWorkflowChild(ctx context.Context, args []string, systems []WorkflowSystem) error {
	if len(args) != 4 || args[0] != "--system" || args[2] != "--spec" {
		return errors.New("bench: usage: --system NAME --spec JSON")
	}
	var spec WorkflowSpec
	if err := json.Unmarshal([]byte(args[3]), &spec); err != nil {
		return fmt.Errorf("bench: --spec: %w", err)
	}
	for _, s := range systems {
		if s.Name() == args[1] {
			res, err := RunWorkflow(ctx, s, spec)
			if err != nil {
				return err
			}
			b, _ := json.Marshal(res)
			fmt.Printf("wfresult %s\n", b)
			return nil
		}
	}
	return fmt.Errorf("bench: unknown workflow system %q", args[1])
}

// ParseWorkflowResult finds the "wfresult" line in a measurement process's
// output.
func ParseWorkflowResult(out string) (WorkflowResult, error) {
	var res WorkflowResult
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if j, ok := strings.CutPrefix(lines[i], "wfresult "); ok {
			return res, json.Unmarshal([]byte(j), &res)
		}
	}
	return res, fmt.Errorf("no result line in the output:\n%s", out)
}

// processCPU is the CPU (user + system) this process has used, -1 when
// unknown.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func perRun(before, after int64, runs int) float64 {
	if before < 0 || after < 0 || runs == 0 {
		return -1
	}
	return float64(after-before) / float64(runs)
}

// StatementCounter is a pgx tracer that counts the statements sent through
// the connections it is set on (ConnConfig.Tracer), batched ones included.
type StatementCounter struct{ n atomic.Int64 }

// Count is the statements sent so far.
func (c *StatementCounter) Count() int64 { return c.n.Load() }

func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *StatementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *StatementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (c *StatementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// CountingPool opens a pool on url with at most maxConns connections whose
// statements c counts.
func CountingPool(ctx context.Context, url string, maxConns int, c *StatementCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.Tracer = c
	return pgxpool.NewWithConfig(ctx, cfg)
}
