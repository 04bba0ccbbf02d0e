package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The worker-process protocol, over the child's stdin and stdout, one line
// each:
//
//	child → parent  ready            pool connected, waiting
//	parent → child  go               start working
//	child → parent  done N           completions so far (every 2 ms, on change)
//	parent → child  (stdin closed)   stop gracefully
//	child → parent  hist {json}      pickup latencies
//	child → parent  win S {json}     pickup latencies of the jobs stamped in
//	                                 window S (Unix seconds / --window), if set
//	child → parent  work {json}      handler work durations, then exit

// childArgs renders a worker process's flags.
func childArgs(system, url string, cfg WorkerConfig) []string {
	args := []string{"--system", system, "--database-url", url, "--workers", fmt.Sprint(cfg.Workers),
		"--job-sleep", cfg.Job.Sleep.String(), "--job-hash", fmt.Sprint(cfg.Job.Hash), "--prefetch", fmt.Sprint(cfg.Prefetch),
		"--claim-coalesce", cfg.ClaimCoalesce.String()}
	if cfg.Window > 0 {
		args = append(args, "--window", cfg.Window.String())
	}
	if cfg.NoClaimFloor {
		args = append(args, "--no-claim-floor")
	}
	if cfg.SynchronousClaims {
		args = append(args, "--synchronous-claims")
	}
	if cfg.StartEarly {
		args = append(args, "--start-early")
	}
	if cfg.Queues > 1 {
		args = append(args, "--queues", fmt.Sprint(cfg.Queues))
	}
	return args
}

// RunChild is the body of a worker process: args are what the parent
// passed; systems are those this binary knows.
func RunChild(ctx context.Context, args []string, systems []System) error {
	fs := flag.NewFlagSet("bench worker", flag.ContinueOnError)
	name := fs.String("system", "relay", "system")
	url := fs.String("database-url", "", "PostgreSQL URL")
	var cfg WorkerConfig
	fs.IntVar(&cfg.Workers, "workers", 100, "slots")
	fs.IntVar(&cfg.Prefetch, "prefetch", 0, "jobs claimed beyond the slots")
	fs.DurationVar(&cfg.Job.Sleep, "job-sleep", 0, "sleep per job")
	fs.IntVar(&cfg.Job.Hash, "job-hash", 0, "hash rounds per job")
	fs.DurationVar(&cfg.ClaimCoalesce, "claim-coalesce", 0, "Relay's ClaimCoalesce (0: default, negative: off)")
	fs.BoolVar(&cfg.NoClaimFloor, "no-claim-floor", false, "relay: Config.NoClaimFloor")
	fs.BoolVar(&cfg.SynchronousClaims, "synchronous-claims", false, "relay: Config.SynchronousClaims")
	fs.IntVar(&cfg.Queues, "queues", 0, "relay: serve this many queues q0 … q<n-1>")
	fs.BoolVar(&cfg.StartEarly, "start-early", false, "start the client before the parent's go (steady runs)")
	fs.DurationVar(&cfg.Window, "window", 0, "also report pickup latencies per window of this length (by insert time)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if path := os.Getenv("RELAY_BENCH_CPUPROFILE"); path != "" {
		// One profile per worker process: path.<pid>.
		f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if os.Getenv(EnvTrace) == "1" {
		defer InstallTracing()()
	}
	var sys System
	for _, s := range systems {
		if s.Name() == *name {
			sys = s
		}
	}
	if sys == nil {
		return fmt.Errorf("bench worker: unknown system %q", *name)
	}
	pcfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(max(8, min(cfg.Workers+4, 40)))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}

	var mu sync.Mutex // serialises stdout lines
	say := func(format string, a ...any) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
		mu.Unlock()
	}
	workCtx, stop := context.WithCancel(ctx)
	defer stop()
	var hist, work Histogram
	windows := map[int64]*Histogram{}
	var histMu sync.Mutex
	var completed atomic.Int64
	keyedStarts := map[int64]int64{} // job id → its handler's first start, µs since the Unix epoch
	hooks := Hooks{
		Started: func(stamp int64) {
			if stamp == 0 {
				return
			}
			d := time.Since(time.Unix(0, stamp))
			histMu.Lock()
			hist.Record(d)
			if cfg.Window > 0 {
				w := stamp / int64(cfg.Window)
				h := windows[w]
				if h == nil {
					h = &Histogram{}
					windows[w] = h
				}
				h.Record(d)
			}
			histMu.Unlock()
		},
		Worked: func(d time.Duration) {
			histMu.Lock()
			work.Record(d)
			histMu.Unlock()
		},
		Completed: func(total int64) { completed.Store(total) },
		KeyedStarted: func(id int64, at time.Time) {
			us := at.UnixMicro()
			histMu.Lock()
			if old, ok := keyedStarts[id]; !ok || us < old {
				keyedStarts[id] = us
			}
			histMu.Unlock()
		},
	}
	reporterDone := make(chan struct{})
	go func() {
		defer close(reporterDone)
		// Every 2 ms, and only on change: the parent times a burn-down to
		// the report of the last completion, so this bounds its error.
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		last := int64(-1)
		for {
			select {
			case <-workCtx.Done():
				return
			case <-t.C:
			}
			if n := completed.Load(); n != last {
				say("done %d", n)
				last = n
			}
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	waitGo := func() error {
		if !in.Scan() || in.Text() != "go" {
			return errors.New("bench worker: no go from the parent")
		}
		go func() {
			for in.Scan() {
			}
			stop() // stdin closed: the parent says stop
		}()
		return nil
	}
	workErr := make(chan error, 1)
	if !cfg.StartEarly {
		say("ready")
		if err := waitGo(); err != nil {
			stop()
			<-reporterDone
			return err
		}
		workErr <- sys.Work(workCtx, pool, cfg, hooks)
	} else {
		// The client starts before the parent's go, so that the run's
		// clock does not count its start: Work calls Ready once it listens.
		ready := make(chan struct{})
		var readyOnce sync.Once
		hooks.Ready = func() { readyOnce.Do(func() { close(ready) }) }
		go func() { workErr <- sys.Work(workCtx, pool, cfg, hooks) }()
		select {
		case <-ready:
		case err := <-workErr:
			stop()
			<-reporterDone
			if err == nil {
				err = errors.New("bench worker: the system stopped before it was ready")
			}
			return err
		}
		say("ready")
		if err := waitGo(); err != nil {
			stop()
			<-workErr
			<-reporterDone
			return err
		}
	}
	err = <-workErr
	<-reporterDone
	say("done %d", completed.Load())
	histMu.Lock()
	enc, _ := json.Marshal(&hist)
	wenc, _ := json.Marshal(&work)
	for w, h := range windows {
		wh, _ := json.Marshal(h)
		say("win %d %s", w, wh)
	}
	// Lines of at most 2,000 "id:µs" pairs, well within the parent's
	// line buffer.
	var line strings.Builder
	n := 0
	for id, us := range keyedStarts {
		fmt.Fprintf(&line, " %d:%d", id, us)
		if n++; n == 2000 {
			say("keyed%s", line.String())
			line.Reset()
			n = 0
		}
	}
	if n > 0 {
		say("keyed%s", line.String())
	}
	histMu.Unlock()
	say("hist %s", enc)
	say("work %s", wenc)
	return err
}
