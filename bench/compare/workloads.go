package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relayq/relay/bench"
)

type comparison struct {
	self    string // this binary, for measurement processes
	o       options
	systems []bench.System
	envs    map[string]bench.Env
	rows    []summaryRow
}

// summaryRow is one figure of the final table: the mean over the rounds
// for each system.
type summaryRow struct {
	workload, metric string
	relay, other     float64
	otherName        string
	lowerIsBetter    bool
}

// add records a row per system other than "relay" in vals (River, DBOS,
// the floor), in the order of c.systems and then by name.
func (c *comparison) add(workload, metric string, lower bool, vals map[string][]float64) {
	var names []string
	for _, sys := range c.systems {
		if _, ok := vals[sys.Name()]; ok && sys.Name() != "relay" {
			names = append(names, sys.Name())
		}
	}
	var others []string
	for name := range vals {
		if name != "relay" && !slices.Contains(names, name) {
			others = append(others, name)
		}
	}
	slices.Sort(others) // the same order in every run
	names = append(names, others...)
	for _, name := range names {
		c.rows = append(c.rows, summaryRow{workload: workload, metric: metric, lowerIsBetter: lower,
			relay: mean(vals["relay"]), otherName: name, other: mean(vals[name])})
	}
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// perK is a CPU duration per 1,000 jobs, in ms (NaN-free: -1 when unknown).
func perK(d time.Duration, jobs int) float64 {
	if d < 0 || jobs == 0 {
		return -1
	}
	return msf(d) * 1000 / float64(jobs)
}

// each runs f for every round and system, A B A B, printing each result.
func (c *comparison) each(title string, workers func(sys bench.System) int, f func(sys bench.System, env bench.Env, workers int) (bench.Result, error)) (map[string][]bench.Result, error) {
	fmt.Printf("\n== %s\n", title)
	for _, sys := range c.systems {
		fmt.Printf("   %s: %s\n", sys.Name(), sys.Describe(bench.WorkerConfig{Workers: workers(sys)}))
	}
	out := map[string][]bench.Result{}
	for r := 1; r <= c.o.rounds; r++ {
		for _, sys := range c.systems {
			fmt.Printf("-- round %d: %s\n", r, sys.Name())
			res, err := f(sys, c.envs[sys.Name()], workers(sys))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sys.Name(), err)
			}
			fmt.Println(res.Line())
			out[sys.Name()] = append(out[sys.Name()], res)
		}
	}
	return out, nil
}

func collect(res map[string][]bench.Result, f func(bench.Result) float64) map[string][]float64 {
	out := map[string][]float64{}
	for name, rs := range res {
		for _, r := range rs {
			out[name] = append(out[name], f(r))
		}
	}
	return out
}

func (c *comparison) burnDown(ctx context.Context) error {
	workers := func(sys bench.System) int {
		if sys.Name() == "river" {
			return c.o.w1RiverW
		}
		return c.o.w1RelayWorkers
	}
	res, err := c.each(fmt.Sprintf("workload 1: burn-down of %d no-op jobs (batches of 5,000), one worker process", c.o.w1Jobs), workers,
		func(sys bench.System, env bench.Env, w int) (bench.Result, error) {
			return bench.RunBurnDown(ctx, env, sys, bench.BurnDown{Jobs: c.o.w1Jobs, Workers: w, Processes: 1})
		})
	if err != nil {
		return err
	}
	c.add("1 burn-down", "inserts/s", false, collect(res, func(r bench.Result) float64 { return r.InsertsPerSec }))
	c.add("1 burn-down", "worked jobs/s", false, collect(res, func(r bench.Result) float64 { return r.WorkedPerSec }))
	c.add("1 burn-down", "PostgreSQL CPU ms / 1k jobs (drain)", true, collect(res, func(r bench.Result) float64 { return perK(r.PGCPU, r.Jobs) }))
	c.add("1 burn-down", "worker CPU ms / 1k jobs (drain)", true, collect(res, func(r bench.Result) float64 { return perK(r.WorkerCPU, r.Jobs) }))
	return nil
}

func (c *comparison) steady(ctx context.Context) error {
	res, err := c.each(fmt.Sprintf("workload 2: steady %d jobs/s for %s, %d workers", c.o.w2Rate, c.o.w2Duration, c.o.w2Workers),
		func(bench.System) int { return c.o.w2Workers },
		func(sys bench.System, env bench.Env, w int) (bench.Result, error) {
			return bench.RunSteady(ctx, env, sys, bench.Steady{Rate: c.o.w2Rate, Duration: c.o.w2Duration, Workers: w, Processes: 1})
		})
	if err != nil {
		return err
	}
	c.add("2 steady", "completed jobs/s", false, collect(res, func(r bench.Result) float64 { return r.WorkedPerSec }))
	for i, q := range []string{"p50", "p95", "p99"} {
		c.add("2 steady", "pickup "+q+" ms", true, collect(res, func(r bench.Result) float64 { return msf(r.Pickup[i]) }))
	}
	c.add("2 steady", "end-to-end p99 ms", true, collect(res, func(r bench.Result) float64 { return msf(r.EndToEnd[2]) }))
	c.add("2 steady", "PostgreSQL CPU ms / 1k jobs", true, collect(res, func(r bench.Result) float64 { return perK(r.PGCPU, r.Jobs) }))
	return nil
}

func (c *comparison) slots(ctx context.Context) error {
	job := bench.Job{Sleep: 10 * time.Millisecond, Hash: 1000}
	for _, shape := range []struct{ processes, workers int }{{1, 1}, {1, 4}, {3, 4}} {
		slots := shape.processes * shape.workers
		limit := float64(slots) / job.Sleep.Seconds()
		// Relay prefetches a job or two per process so that a finishing
		// worker starts the next job without a claim round trip; River has
		// no such setting.
		prefetch := max(1, shape.workers/2)
		res, err := c.each(fmt.Sprintf("workload 3: %d jobs (sleep 10ms + 1,000 SHA-256 rounds), %d slot(s) = %d process(es) × %d; limit %.0f jobs/s; Relay Prefetch %d",
			c.o.w3Jobs, slots, shape.processes, shape.workers, limit, prefetch),
			func(bench.System) int { return shape.workers },
			func(sys bench.System, env bench.Env, w int) (bench.Result, error) {
				return bench.RunBurnDown(ctx, env, sys, bench.BurnDown{Jobs: c.o.w3Jobs, Workers: w, Prefetch: prefetch, Processes: shape.processes, Job: job})
			})
		if err != nil {
			return err
		}
		name := fmt.Sprintf("3 slots=%d", slots)
		c.add(name, "worked jobs/s", false, collect(res, func(r bench.Result) float64 { return r.WorkedPerSec }))
		c.add(name, "% of the slot limit", false, collect(res, func(r bench.Result) float64 { return 100 * r.WorkedPerSec / limit }))
		// time.Sleep(10ms) overshoots by a fraction of a millisecond under
		// load; the handler's measured time bounds every queue.
		c.add(name, "% of the measured-work limit", false, collect(res, func(r bench.Result) float64 {
			if r.WorkMean <= 0 {
				return -1
			}
			return 100 * r.WorkedPerSec / (float64(slots) / r.WorkMean.Seconds())
		}))
		c.add(name, "mean handler time ms", true, collect(res, func(r bench.Result) float64 { return msf(r.WorkMean) }))
	}
	return nil
}

func (c *comparison) scale(ctx context.Context) error {
	drain := func(keep bool) func(sys bench.System, env bench.Env, w int) (bench.Result, error) {
		return func(sys bench.System, env bench.Env, w int) (bench.Result, error) {
			return bench.RunBurnDown(ctx, env, sys, bench.BurnDown{Jobs: c.o.w4Jobs, Workers: w, Processes: 1, KeepTable: keep})
		}
	}
	workers := func(bench.System) int { return c.o.w4Workers }
	empty, err := c.each(fmt.Sprintf("workload 4a: drain %d jobs from an empty table", c.o.w4Jobs), workers, drain(false))
	if err != nil {
		return err
	}
	fmt.Printf("\n== workload 4: filling each table with %d finished jobs (then VACUUM ANALYZE)\n", c.o.w4Fill)
	for _, sys := range c.systems {
		env := c.envs[sys.Name()]
		start := time.Now()
		if err := sys.Reset(ctx, env.Pool); err != nil {
			return err
		}
		if err := sys.FillFinished(ctx, env.Pool, c.o.w4Fill); err != nil {
			return fmt.Errorf("%s fill: %w", sys.Name(), err)
		}
		if _, err := env.Pool.Exec(ctx, "VACUUM ANALYZE "+sys.Table()); err != nil {
			return err
		}
		fmt.Printf("   %s: filled in %s\n", sys.Name(), time.Since(start).Round(time.Second))
	}
	full, err := c.each(fmt.Sprintf("workload 4b: drain %d jobs from a table holding %d finished jobs", c.o.w4Jobs, c.o.w4Fill), workers, drain(true))
	if err != nil {
		return err
	}
	e := collect(empty, func(r bench.Result) float64 { return r.WorkedPerSec })
	f := collect(full, func(r bench.Result) float64 { return r.WorkedPerSec })
	c.add("4 scale", "worked jobs/s, empty table", false, e)
	c.add("4 scale", fmt.Sprintf("worked jobs/s, %dM finished rows", c.o.w4Fill/1_000_000), false, f)
	ratio := map[string][]float64{}
	for name := range e {
		ratio[name] = []float64{100 * mean(f[name]) / mean(e[name])}
	}
	c.add("4 scale", "full ÷ empty, %", false, ratio)
	return nil
}

func (c *comparison) summary() {
	fmt.Printf("\n== summary (mean of %d rounds; ratio = Relay ÷ the other)\n", c.o.rounds)
	fmt.Printf("%-16s %-44s %12s %12s %8s\n", "workload", "figure", "relay", "other", "ratio")
	fmt.Println(strings.Repeat("-", 96))
	for _, r := range c.rows {
		ratio := "n/a"
		if r.other > 0 && r.relay >= 0 {
			ratio = fmt.Sprintf("%.2f", r.relay/r.other)
		}
		note := ""
		if r.lowerIsBetter {
			note = " (lower is better)"
		}
		fmt.Printf("%-16s %-44s %12.2f %12.2f %8s\n", r.workload, r.metric+note, r.relay, r.other, ratio+" "+r.otherName)
	}
}

// steadySweep is workload 8: the steady load at each rate of
// --sweep-rates, River beside Relay at each ClaimCoalesce of
// --sweep-windows, alternating (River, then Relay at each window, every
// round): PostgreSQL CPU per job against pickup latency (issue 17, item 2).
func (c *comparison) steadySweep(ctx context.Context) error {
	type key struct {
		rate   int
		system string // "river", or "relay <window>"
	}
	results := map[key][]bench.Result{}
	loads := map[key][]float64{}
	var order []key
	run := func(k key, sys bench.System, window time.Duration) error {
		if _, ok := results[k]; !ok {
			order = append(order, k)
		}
		fmt.Printf("-- %d jobs/s: %s (load average %.2f)\n", k.rate, k.system, loadAverage())
		loads[k] = append(loads[k], loadAverage())
		res, err := bench.RunSteady(ctx, c.envs[sys.Name()], sys, bench.Steady{Rate: k.rate, Duration: c.o.sweepDuration,
			Workers: c.o.w2Workers, Processes: 1, ClaimCoalesce: window})
		if err != nil {
			return fmt.Errorf("%s at %d/s: %w", k.system, k.rate, err)
		}
		fmt.Println(res.Line())
		results[k] = append(results[k], res)
		return nil
	}
	fmt.Printf("\n== workload 8: steady load, PostgreSQL CPU per job against pickup latency; Relay's ClaimCoalesce %v; rates %v, %s each, %d workers\n",
		c.o.sweepWindows, c.o.sweepRates, c.o.sweepDuration, c.o.w2Workers)
	var relay, river bench.System
	for _, sys := range c.systems {
		switch sys.Name() {
		case "relay":
			relay = sys
		case "river":
			river = sys
		}
	}
	for r := 1; r <= c.o.rounds; r++ {
		for _, rate := range c.o.sweepRates {
			if err := run(key{rate, river.Name()}, river, 0); err != nil {
				return err
			}
			for _, w := range c.o.sweepWindows {
				if err := run(key{rate, "relay " + windowName(w)}, relay, w); err != nil {
					return err
				}
			}
		}
	}
	fmt.Printf("\n== workload 8 (mean of %d rounds; CPU ratio = ÷ River's at the same rate)\n", c.o.rounds)
	fmt.Printf("%8s %-14s %10s %12s %10s %8s %8s %8s %8s\n", "rate", "system", "offered/s", "pg ms/1k", "÷ River", "p50 ms", "p95 ms", "p99 ms", "load")
	for _, k := range order {
		rs := results[k]
		get := func(f func(bench.Result) float64) float64 {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, f(r))
			}
			return mean(xs)
		}
		cpu := get(func(r bench.Result) float64 { return perK(r.PGCPU, r.Jobs) })
		riverCPU := mean(collect(map[string][]bench.Result{"r": results[key{k.rate, river.Name()}]}, func(r bench.Result) float64 { return perK(r.PGCPU, r.Jobs) })["r"])
		fmt.Printf("%8d %-14s %10.0f %12.1f %10.2f %8.2f %8.2f %8.2f %8.2f\n", k.rate, k.system,
			get(func(r bench.Result) float64 { return r.OfferedPerSec }), cpu, cpu/riverCPU,
			get(func(r bench.Result) float64 { return msf(r.Pickup[0]) }),
			get(func(r bench.Result) float64 { return msf(r.Pickup[1]) }),
			get(func(r bench.Result) float64 { return msf(r.Pickup[2]) }), mean(loads[k]))
	}
	return nil
}

// windowName names a ClaimCoalesce setting.
func windowName(w time.Duration) string {
	switch {
	case w < 0:
		return "off"
	case w == 0:
		return "default"
	}
	return w.String()
}

// loadAverage is the machine's 1-minute load average (-1: unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
