package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Env is where a workload runs.
type Env struct {
	// Pool reaches the system's tables (its own schema).
	Pool *pgxpool.Pool
	// URL is Pool's URL, for the worker processes.
	URL string
	// Spawn returns the command for one worker process, given its
	// arguments (this binary's worker subcommand is the caller's choice).
	Spawn func(args []string) *exec.Cmd
	// Out receives progress lines.
	Out io.Writer
}

// Result is one workload's figures. Durations are zero when not measured.
type Result struct {
	Mode      string
	System    string
	Jobs      int
	Workers   int // per process
	Processes int
	Job       Job

	InsertsPerSec float64
	WorkedPerSec  float64
	OfferedPerSec float64 // steady: the rate actually offered

	Pickup [3]time.Duration // p50, p95, p99: insert → handler start
	// Windows are the pickup latencies per Steady.Window, by insert time,
	// oldest first (steady mode with a window only).
	Windows  []Window
	EndToEnd [3]time.Duration // p50, p95, p99: created → finalized (from the table)

	// KeyedStarts is when the handler of each job with an ordering key
	// first started: job id → microseconds since the Unix epoch, by the
	// worker processes' clock (Relay with keys only).
	KeyedStarts map[int64]int64

	WorkMean  time.Duration // mean time in Job.Do per job (the handler's own work)
	Elapsed   time.Duration // the measured phase
	PGCPU     time.Duration // PostgreSQL's CPU during the measured phase (-1: unknown)
	WorkerCPU time.Duration // the worker processes' CPU
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// Line is the machine-readable summary.
func (r Result) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bench: mode=%s system=%s jobs=%d workers=%d processes=%d job_sleep=%s job_hash=%d",
		r.Mode, r.System, r.Jobs, r.Workers, r.Processes, r.Job.Sleep, r.Job.Hash)
	if r.Mode == "steady" {
		fmt.Fprintf(&b, " offered_per_s=%.0f", r.OfferedPerSec)
	} else {
		fmt.Fprintf(&b, " inserts_per_s=%.0f", r.InsertsPerSec)
	}
	fmt.Fprintf(&b, " worked_per_s=%.0f p50_ms=%s p95_ms=%s p99_ms=%s e2e_p50_ms=%s e2e_p95_ms=%s e2e_p99_ms=%s",
		r.WorkedPerSec, ms(r.Pickup[0]), ms(r.Pickup[1]), ms(r.Pickup[2]), ms(r.EndToEnd[0]), ms(r.EndToEnd[1]), ms(r.EndToEnd[2]))
	per1k := func(d time.Duration) string {
		if d < 0 || r.Jobs == 0 {
			return "n/a"
		}
		return ms(d * 1000 / time.Duration(r.Jobs))
	}
	fmt.Fprintf(&b, " work_mean_ms=%s pg_cpu_ms_per_1k=%s worker_cpu_ms_per_1k=%s", ms(r.WorkMean), per1k(r.PGCPU), per1k(r.WorkerCPU))
	return b.String()
}

// BurnDown is the burn-down workload's settings.
type BurnDown struct {
	Jobs      int
	Workers   int // per process
	Prefetch  int
	Processes int
	Job       Job
	// Batch is the jobs per insert batch. Default 5000.
	Batch int
	// KeepTable skips emptying the table first (the scale workload keeps
	// its finished rows).
	KeepTable bool
	// Queues is WorkerConfig.Queues.
	Queues int
	// DueAt, when set, is when the inserted jobs become due (Relay.DueAt):
	// the drain is timed from then, not from the workers' go.
	DueAt time.Time
}

// RunBurnDown inserts the jobs in batches, then drains them with fresh
// worker processes, timing each phase.
func RunBurnDown(ctx context.Context, env Env, sys System, o BurnDown) (Result, error) {
	if o.Batch <= 0 {
		o.Batch = 5000
	}
	o.Processes = max(o.Processes, 1)
	r := Result{Mode: "burndown", System: sys.Name(), Jobs: o.Jobs, Workers: o.Workers, Processes: o.Processes, Job: o.Job}
	if !o.KeepTable {
		if err := sys.Reset(ctx, env.Pool); err != nil {
			return r, fmt.Errorf("reset: %w", err)
		}
	}
	start := time.Now()
	for done := 0; done < o.Jobs; {
		n := min(o.Batch, o.Jobs-done)
		if err := sys.InsertBatch(ctx, env.Pool, n); err != nil {
			return r, fmt.Errorf("insert: %w", err)
		}
		done += n
	}
	r.InsertsPerSec = float64(o.Jobs) / time.Since(start).Seconds()
	fmt.Fprintf(env.Out, "  %s: inserted %d jobs at %.0f/s\n", sys.Name(), o.Jobs, r.InsertsPerSec)
	if _, err := env.Pool.Exec(ctx, "ANALYZE "+sys.Table()); err != nil {
		return r, err
	}

	cfg := WorkerConfig{Workers: o.Workers, Prefetch: o.Prefetch, Job: o.Job, Queues: o.Queues}
	if !o.DueAt.IsZero() && time.Now().After(o.DueAt) {
		return r, fmt.Errorf("the jobs became due (%s) before their insert ended: give them longer", o.DueAt.Format(time.RFC3339Nano))
	}
	f, err := startFleet(ctx, env, sys, cfg, o.Processes)
	if err != nil {
		return r, err
	}
	defer f.kill()
	cpu0 := pgCPU(ctx, env.Pool)
	began := time.Now()
	f.start()
	lastPrint := began
	for f.completed() < int64(o.Jobs) {
		if err := f.failed(); err != nil {
			return r, err
		}
		if time.Since(lastPrint) >= 2*time.Second {
			lastPrint = time.Now()
			n := f.completed()
			fmt.Fprintf(env.Out, "  %s: worked %d/%d (%.0f/s so far)\n", sys.Name(), n, o.Jobs, float64(n)/time.Since(began).Seconds())
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return r, err
		}
	}
	r.Elapsed = time.Since(began)
	if !o.DueAt.IsZero() {
		r.Elapsed = time.Since(o.DueAt)
	}
	r.PGCPU = cpuSince(ctx, env.Pool, cpu0)
	r.WorkedPerSec = float64(o.Jobs) / r.Elapsed.Seconds()
	hist, work, wcpu, err := f.stop()
	if err != nil {
		return r, err
	}
	r.WorkerCPU, r.WorkMean, r.KeyedStarts = wcpu, work.Mean(), f.keyed
	r.Pickup = [3]time.Duration{hist.Quantile(0.5), hist.Quantile(0.95), hist.Quantile(0.99)}
	return r, nil
}

// Steady is the steady-rate workload's settings.
type Steady struct {
	Rate      int // jobs offered per second
	Duration  time.Duration
	Workers   int // per process
	Prefetch  int
	Processes int
	Job       Job
	// ClaimCoalesce is Relay's Config.ClaimCoalesce (see WorkerConfig).
	ClaimCoalesce time.Duration
	// Producers is the number of goroutines inserting. Default 32.
	Producers int
	// KeepTable skips emptying the table first (a key's backlog stays).
	KeepTable bool
	// Window, when set, also measures pickup latency per window of this
	// length (Result.Windows).
	Window time.Duration
	// NoClaimFloor turns Relay's claim floor off.
	NoClaimFloor bool
	// SynchronousClaims makes Relay's claims commit synchronously.
	SynchronousClaims bool
	// Queues is WorkerConfig.Queues.
	Queues int
	// During, when set, runs beside the offered load from its start (an
	// xmin holder, say); the run waits for it to return before it ends.
	During func(ctx context.Context, began time.Time)
}

// producers is a System whose producers insert with a configuration of
// their own, made to match the workers' (Relay.ForProducers).
type producers interface {
	ForProducers(pool *pgxpool.Pool, cfg WorkerConfig) (System, error)
}

// RunSteady offers Rate single-job inserts per second for Duration to
// running workers, then waits for the last to finish. Pickup latency runs
// from just before each insert (its commit included) to its handler's
// start.
func RunSteady(ctx context.Context, env Env, sys System, o Steady) (Result, error) {
	if o.Producers <= 0 {
		o.Producers = 32
	}
	o.Processes = max(o.Processes, 1)
	r := Result{Mode: "steady", System: sys.Name(), Workers: o.Workers, Processes: o.Processes, Job: o.Job}
	if !o.KeepTable {
		if err := sys.Reset(ctx, env.Pool); err != nil {
			return r, fmt.Errorf("reset: %w", err)
		}
	}
	wcfg := WorkerConfig{Workers: o.Workers, Prefetch: o.Prefetch, Job: o.Job, ClaimCoalesce: o.ClaimCoalesce, Window: o.Window, NoClaimFloor: o.NoClaimFloor, SynchronousClaims: o.SynchronousClaims, StartEarly: true, Queues: o.Queues}
	if p, ok := sys.(producers); ok {
		var err error
		if sys, err = p.ForProducers(env.Pool, wcfg); err != nil {
			return r, fmt.Errorf("producers: %w", err)
		}
	}
	f, err := startFleet(ctx, env, sys, wcfg, o.Processes)
	if err != nil {
		return r, err
	}
	defer f.kill()
	if err := warmPool(ctx, env.Pool, o.Producers); err != nil {
		return r, err
	}
	f.start()
	warm, err := warmUp(ctx, env, sys, f, o.Producers)
	if err != nil {
		return r, err
	}
	cpu0 := pgCPU(ctx, env.Pool)
	duringDone := make(chan struct{})
	if o.During != nil {
		began := time.Now()
		go func() { defer close(duringDone); o.During(ctx, began) }()
	} else {
		close(duringDone)
	}

	tokens := make(chan struct{}, o.Rate*int(o.Duration/time.Second+1))
	var produced atomic.Int64
	var insertErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for range o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range tokens {
				if err := sys.InsertOne(ctx, env.Pool, time.Now()); err != nil {
					insertErr.CompareAndSwap(nil, &err)
					continue
				}
				produced.Add(1)
			}
		}()
	}
	began := time.Now()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
	lastPrint := began
	for time.Since(began) < o.Duration {
		<-tick.C
		due := int(float64(o.Rate) * time.Since(began).Seconds())
		for ; sent < due; sent++ {
			tokens <- struct{}{}
		}
		if time.Since(lastPrint) >= 5*time.Second {
			lastPrint = time.Now()
			fmt.Fprintf(env.Out, "  %s: offered %d, completed %d\n", sys.Name(), produced.Load(), f.completed())
		}
		if err := f.failed(); err != nil {
			return r, err
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	offeredFor := time.Since(began)
	<-duringDone
	if p := insertErr.Load(); p != nil {
		return r, fmt.Errorf("insert: %w", *p)
	}
	deadline := time.Now().Add(60 * time.Second)
	for f.completed() < warm+produced.Load() {
		if time.Now().After(deadline) {
			return r, fmt.Errorf("%d of %d jobs completed 60s after the offer ended", f.completed()-warm, produced.Load())
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return r, err
		}
	}
	r.Elapsed = time.Since(began)
	r.PGCPU = cpuSince(ctx, env.Pool, cpu0)
	r.Jobs = int(produced.Load())
	r.OfferedPerSec = float64(r.Jobs) / offeredFor.Seconds()
	r.WorkedPerSec = float64(r.Jobs) / r.Elapsed.Seconds()
	hist, work, wcpu, err := f.stop()
	if err != nil {
		return r, err
	}
	r.WorkerCPU, r.WorkMean, r.KeyedStarts = wcpu, work.Mean(), f.keyed
	r.Pickup = [3]time.Duration{hist.Quantile(0.5), hist.Quantile(0.95), hist.Quantile(0.99)}
	if o.Window > 0 {
		r.Windows = f.windows(o.Window)
	}
	p50, p95, p99, err := sys.EndToEnd(ctx, env.Pool)
	if err != nil {
		return r, fmt.Errorf("end-to-end latency: %w", err)
	}
	r.EndToEnd = [3]time.Duration{p50, p95, p99}
	return r, nil
}

// warmPool opens n of pool's connections before a steady run's clock
// starts: a backend's start (its fork, its catalog caches) costs
// PostgreSQL several milliseconds of CPU, and dozens of them opened in the
// run's first second saturated a 2-vCPU machine for 2–3 s, a backlog the
// pickup latencies of the whole run then carried (p99 > 1 s for either
// system). A steady run measures the steady state.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n = min(n, int(pool.Config().MaxConns))
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warm the pool: %w", err)
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			return fmt.Errorf("warm the pool: %w", err)
		}
	}
	return nil
}

// warmUp inserts rounds of unstamped jobs (Hooks.Started records no
// pickup for them) from n producers at once and waits until the workers
// finished them, before a steady run's clock starts: each connection's
// first insert, claim and completion plan their statements and fill the
// backend's caches. It returns how many jobs it inserted.
func warmUp(ctx context.Context, env Env, sys System, f *fleet, n int) (int64, error) {
	const rounds = 3
	for range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sys.InsertOne(ctx, env.Pool, time.Unix(0, 0)); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return 0, fmt.Errorf("warm-up insert: %w", err)
		}
	}
	warm := int64(rounds * n)
	deadline := time.Now().Add(60 * time.Second)
	for f.completed() < warm {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("warm-up: %d of %d jobs completed after 60s", f.completed(), warm)
		}
		if err := f.failed(); err != nil {
			return 0, err
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return warm, nil
}

func pgCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	d, err := PostgresCPU(ctx, pool)
	if err != nil {
		return -1
	}
	return d
}

func cpuSince(ctx context.Context, pool *pgxpool.Pool, before time.Duration) time.Duration {
	if before < 0 {
		return -1
	}
	after := pgCPU(ctx, pool)
	if after < 0 {
		return -1
	}
	return after - before
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// fleet is the worker processes of one run.
type fleet struct {
	procs []*proc
	win   map[int64]*Histogram // merged by stop (Steady.Window)
	keyed map[int64]int64      // merged by stop (Result.KeyedStarts)
}

type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	exited chan struct{} // stdout closed
	done   atomic.Int64
	hist   Histogram
	work   Histogram
	win    map[int64]*Histogram // by window number (Steady.Window)
	keyed  map[int64]int64      // Result.KeyedStarts, this process's
}

func startFleet(ctx context.Context, env Env, sys System, cfg WorkerConfig, n int) (*fleet, error) {
	f := &fleet{}
	for range n {
		cmd := env.Spawn(childArgs(sys.Name(), env.URL, cfg))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			f.kill()
			return nil, fmt.Errorf("start worker process: %w", err)
		}
		p := &proc{cmd: cmd, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
		f.procs = append(f.procs, p)
		go p.read(stdout)
	}
	for _, p := range f.procs {
		select {
		case <-p.ready:
		case <-p.exited:
			f.kill()
			return nil, errors.New("a worker process exited before it was ready")
		case <-ctx.Done():
			f.kill()
			return nil, ctx.Err()
		case <-time.After(30 * time.Second):
			f.kill()
			return nil, errors.New("a worker process was not ready within 30s")
		}
	}
	return f, nil
}

func (p *proc) read(r io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "ready":
			close(p.ready)
		case strings.HasPrefix(line, "done "):
			if n, err := strconv.ParseInt(line[5:], 10, 64); err == nil {
				p.done.Store(n)
			}
		case strings.HasPrefix(line, "hist "):
			json.Unmarshal([]byte(line[5:]), &p.hist) //nolint:errcheck
		case strings.HasPrefix(line, "win "):
			num, js, _ := strings.Cut(line[4:], " ")
			w, err := strconv.ParseInt(num, 10, 64)
			h := &Histogram{}
			if err == nil && json.Unmarshal([]byte(js), h) == nil {
				if p.win == nil {
					p.win = map[int64]*Histogram{}
				}
				p.win[w] = h
			}
		case strings.HasPrefix(line, "keyed "):
			for _, pair := range strings.Fields(line[6:]) {
				id, us, _ := strings.Cut(pair, ":")
				i, err1 := strconv.ParseInt(id, 10, 64)
				t, err2 := strconv.ParseInt(us, 10, 64)
				if err1 == nil && err2 == nil {
					if p.keyed == nil {
						p.keyed = map[int64]int64{}
					}
					p.keyed[i] = t
				}
			}
		case strings.HasPrefix(line, "work "):
			json.Unmarshal([]byte(line[5:]), &p.work) //nolint:errcheck
		}
	}
}

func (f *fleet) start() {
	for _, p := range f.procs {
		io.WriteString(p.stdin, "go\n") //nolint:errcheck
	}
}

func (f *fleet) completed() int64 {
	var n int64
	for _, p := range f.procs {
		n += p.done.Load()
	}
	return n
}

// failed reports a worker process that exited while it should be working.
func (f *fleet) failed() error {
	for _, p := range f.procs {
		select {
		case <-p.exited:
			return fmt.Errorf("worker process %d exited during the run", p.cmd.Process.Pid)
		default:
		}
	}
	return nil
}

// stop asks every process to stop, waits, and merges their histograms and
// CPU times.
func (f *fleet) stop() (pickup, work Histogram, cpu time.Duration, err error) {
	for _, p := range f.procs {
		p.stdin.Close()
	}
	var errs []error
	for _, p := range f.procs {
		<-p.exited
		if err := p.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("worker process: %w", err))
		}
		if p.cmd.ProcessState != nil {
			cpu += p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
		}
		pickup.Merge(&p.hist)
		work.Merge(&p.work)
		for w, h := range p.win {
			if f.win == nil {
				f.win = map[int64]*Histogram{}
			}
			if f.win[w] == nil {
				f.win[w] = &Histogram{}
			}
			f.win[w].Merge(h)
		}
		for id, us := range p.keyed {
			if f.keyed == nil {
				f.keyed = map[int64]int64{}
			}
			if old, ok := f.keyed[id]; !ok || us < old {
				f.keyed[id] = us
			}
		}
	}
	f.procs = nil
	return pickup, work, cpu, errors.Join(errs...)
}

func (f *fleet) kill() {
	for _, p := range f.procs {
		p.cmd.Process.Kill() //nolint:errcheck
		p.cmd.Wait()         //nolint:errcheck
	}
	f.procs = nil
}

// NewPool opens the harness's own pool on url: large enough that the steady
// workload's producers never queue for a connection (which would count as
// pickup latency).
func NewPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 48
	return pgxpool.NewWithConfig(ctx, cfg)
}
