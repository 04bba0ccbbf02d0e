package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/relayq/relay/bench"
)

// workflowSystems are the workflow engines compared, Relay first, and the
// workflow floor (the fewest writes of a durable 3-step run, no library),
// which measures the chain's queued drain and starts only.
func workflowSystems() []bench.WorkflowSystem {
	return append(relayWorkflowSystems(), DBOS{}, bench.WorkflowFloor{})
}

// wfEach runs spec on every workflow system, A B A B, each measurement in a
// process of its own (so that no engine's goroutines outlive its turn),
// in a schema of its own, and prints each result.
func (c *comparison) wfEach(ctx context.Context, title string, spec bench.WorkflowSpec) (map[string][]bench.WorkflowResult, error) {
	fmt.Printf("\n== %s\n", title)
	var systems []bench.WorkflowSystem
	for _, sys := range workflowSystems() {
		if lo, ok := sys.(interface{ LatencyOnly() bool }); ok && lo.LatencyOnly() && spec.Mode != "latency" {
			continue
		}
		if so, ok := sys.(interface{ StartsOnly() bool }); ok && so.StartsOnly() && spec.Mode != "starts" {
			continue
		}
		if m, ok := sys.(interface{ Measures(bench.WorkflowSpec) bool }); ok && (!m.Measures(spec) || !c.o.floor) {
			continue
		}
		systems = append(systems, sys)
	}
	for _, sys := range systems {
		fmt.Printf("   %s: %s\n", sys.Name(), sys.Describe(spec))
	}
	out := map[string][]bench.WorkflowResult{}
	for r := 1; r <= c.o.rounds; r++ {
		for _, sys := range systems {
			fmt.Printf("-- round %d: %s\n", r, sys.Name())
			s := spec
			s.URL, s.Schema = c.o.url, "bench_wf_"+sys.Name()
			cmd := exec.CommandContext(ctx, c.self, append([]string{"wf"}, bench.WorkflowChildArgs(sys.Name(), s)...)...)
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", sys.Name(), err, stdout.String())
			}
			res, err := bench.ParseWorkflowResult(stdout.String())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sys.Name(), err)
			}
			fmt.Println(res.Line())
			fmt.Print(res.HopsTable())
			out[sys.Name()] = append(out[sys.Name()], res)
		}
	}
	return out, nil
}

func wfCollect(res map[string][]bench.WorkflowResult, f func(bench.WorkflowResult) float64) map[string][]float64 {
	out := map[string][]float64{}
	for name, rs := range res {
		for _, r := range rs {
			out[name] = append(out[name], f(r))
		}
	}
	return out
}

func (c *comparison) wfQueued(ctx context.Context) error {
	return c.queuedShape(ctx, "5 wf queued", bench.ShapeChain, c.o.wfRuns)
}

func (c *comparison) wfSuspend(ctx context.Context) error {
	for _, shape := range []bench.Shape{bench.ShapeSleep, bench.ShapeChild} {
		if err := c.queuedShape(ctx, "7 wf "+string(shape), shape, c.o.wfSuspendRuns); err != nil {
			return err
		}
	}
	return nil
}

func (c *comparison) queuedShape(ctx context.Context, name string, shape bench.Shape, runs int) error {
	spec := bench.WorkflowSpec{Mode: "queued", Shape: shape, Runs: runs, Workers: c.o.wfWorkers, Poll: c.o.wfDBOSPoll}
	res, err := c.wfEach(ctx, fmt.Sprintf("workload %s: %d runs of the %s shape (3 no-op steps) started up front, then drained, %d at once",
		name, runs, shape, c.o.wfWorkers), spec)
	if err != nil {
		return err
	}
	c.add(name, "runs started/s (before the drain)", false, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.StartedPerSec }))
	c.add(name, "runs/s", false, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.RunsPerSec }))
	c.add(name, "steps/s", false, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.StepsPerSec }))
	c.add(name, "PostgreSQL CPU ms / 1k runs", true, wfCollect(res, func(r bench.WorkflowResult) float64 { return perKRuns(r) }))
	c.add(name, "process CPU ms / 1k runs", true, wfCollect(res, func(r bench.WorkflowResult) float64 {
		if r.ProcessCPU < 0 || r.Runs == 0 {
			return -1
		}
		return msf(r.ProcessCPU) * 1000 / float64(r.Runs)
	}))
	c.add(name, "statements / run", true, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.StatementsPerRun }))
	return nil
}

// wfStarts is workload 9: starting runs, nothing executing them — Relay's
// Start (each its own transaction), Start batched in one transaction,
// StartMany, and DBOS's enqueue (each its own transaction: its client
// enqueues one workflow a call).
func (c *comparison) wfStarts(ctx context.Context) error {
	spec := bench.WorkflowSpec{Mode: "starts", Shape: bench.ShapeChain, Runs: c.o.wfStartRuns, Batch: c.o.wfStartBatch, Workers: c.o.wfWorkers, Poll: c.o.wfDBOSPoll}
	res, err := c.wfEach(ctx, fmt.Sprintf("workload 9 wf starts: %d runs started by 16 callers (batches of %d where the system batches), none executed",
		spec.Runs, spec.Batch), spec)
	if err != nil {
		return err
	}
	c.add("9 wf starts", "runs started/s", false, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.StartedPerSec }))
	c.add("9 wf starts", "statements / run", true, wfCollect(res, func(r bench.WorkflowResult) float64 { return r.StatementsPerRun }))
	c.add("9 wf starts", "PostgreSQL CPU ms / 1k runs", true, wfCollect(res, func(r bench.WorkflowResult) float64 { return perKRuns(r) }))
	return nil
}

func perKRuns(r bench.WorkflowResult) float64 {
	if r.PGCPU < 0 || r.Runs == 0 {
		return -1
	}
	return msf(r.PGCPU) * 1000 / float64(r.Runs)
}

func (c *comparison) wfLatency(ctx context.Context) error {
	for _, callers := range c.o.wfCallers {
		spec := bench.WorkflowSpec{Mode: "latency", Shape: bench.ShapeChain, Callers: callers, Duration: c.o.wfDuration,
			Warmup: c.o.wfWarmup, Workers: max(c.o.wfWorkers, callers), Poll: c.o.wfDBOSPoll, Hops: c.o.wfHops}
		name := fmt.Sprintf("6 wf %d caller(s)", callers)
		res, err := c.wfEach(ctx, fmt.Sprintf("workload %s: each starts a 3-step run and waits for its result, for %s (after %s of warm-up)",
			name, c.o.wfDuration, c.o.wfWarmup), spec)
		if err != nil {
			return err
		}
		// A row per Relay start mode, each beside DBOS: queued start
		// ("relay"), then eager start ("relay_eager").
		eager := res["relay_eager"]
		delete(res, "relay_eager")
		for _, row := range []struct {
			name string
			res  map[string][]bench.WorkflowResult
		}{{name, res}, {name + " Relay eager", map[string][]bench.WorkflowResult{"relay": eager, "dbos": res["dbos"]}}} {
			if len(row.res["relay"]) == 0 {
				continue
			}
			c.add(row.name, "runs/s", false, wfCollect(row.res, func(r bench.WorkflowResult) float64 { return r.RunsPerSec }))
			c.add(row.name, "p50 ms", true, wfCollect(row.res, func(r bench.WorkflowResult) float64 { return msf(r.P50) }))
			c.add(row.name, "p99 ms", true, wfCollect(row.res, func(r bench.WorkflowResult) float64 { return msf(r.P99) }))
			c.add(row.name, "PostgreSQL CPU ms / 1k runs", true, wfCollect(row.res, func(r bench.WorkflowResult) float64 { return perKRuns(r) }))
		}
	}
	return nil
}
