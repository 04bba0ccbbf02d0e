package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/bench"
	"github.com/relayq/relay/internal/devpg"
	"github.com/relayq/relay/migrations"
)

//go:embed prove.sql
var proveAudit string

//go:embed prove_schema.sql
var proveSchema string

type proveConfig struct {
	url          string
	jobs         int
	processes    int
	concurrency  int
	jobTime      time.Duration
	kills        int
	sigterms     int
	lease        time.Duration
	pgRestart    bool
	pgCrash      bool
	backendKill  int
	backendKillD time.Duration
	pauses       int
	timeout      time.Duration
	keep         bool
}

func runProve(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "scheduler" {
		return runProveScheduler(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "idempotency" {
		return runProveIdempotency(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "outbox" {
		return runProveOutbox(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "workflow" {
		return runProveWorkflow(ctx, args[1:])
	}
	if len(args) == 0 || args[0] != "queue" {
		return errors.New("prove: usage: relay prove queue|scheduler|idempotency|outbox|workflow [flags]")
	}
	fs := flag.NewFlagSet("prove queue", flag.ContinueOnError)
	var c proveConfig
	fs.StringVar(&c.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	fs.IntVar(&c.jobs, "jobs", 1000, "jobs to enqueue")
	fs.IntVar(&c.processes, "processes", 3, "worker OS processes")
	fs.IntVar(&c.concurrency, "concurrency", 8, "jobs at once per process")
	fs.DurationVar(&c.jobTime, "job-time", 20*time.Millisecond, "handler duration (±50% jitter)")
	fs.IntVar(&c.kills, "kill", 0, "SIGKILL a random worker process this many times, restarting it")
	fs.IntVar(&c.sigterms, "sigterm", 0, "SIGTERM a random worker process this many times (it must drain), restarting it")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "lease duration")
	fs.BoolVar(&c.pgRestart, "pg-restart", false, "restart PostgreSQL mid-run (throwaway cluster only)")
	fs.BoolVar(&c.pgCrash, "pg-crash", false, "crash PostgreSQL mid-run (immediate shutdown, recovery from WAL; throwaway cluster only)")
	fs.IntVar(&c.backendKill, "backend-kill", 0, "terminate this many worker backends per second (pg_terminate_backend)")
	fs.DurationVar(&c.backendKillD, "backend-kill-for", 3*time.Second, "how long --backend-kill goes on")
	fs.IntVar(&c.pauses, "pause", 0, "SIGSTOP a worker holding a job until another worker has taken that job over, then SIGCONT it (late-worker case), this many times")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.BoolVar(&c.keep, "keep", false, "keep the proof's schema afterwards")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if c.jobs < 1 || c.processes < 1 || c.concurrency < 1 || c.kills < 0 || c.sigterms < 0 || c.lease < 200*time.Millisecond {
		return errors.New("prove: --jobs, --processes, --concurrency must be ≥ 1, --kill/--sigterm ≥ 0, --lease ≥ 200ms")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	if c.url != "" && (c.pgRestart || c.pgCrash) {
		return errors.New("prove: --pg-restart and --pg-crash need the throwaway cluster (omit --database-url)")
	}
	db, err := openProofDB(ctx, c.url, c.keep)
	if err != nil {
		return fmt.Errorf("prove: %w", err)
	}
	defer db.Close()
	pool, schemaURL, cluster := db.Pool, db.URL, db.Cluster
	if _, err := pool.Exec(ctx, proveSchema); err != nil {
		return fmt.Errorf("prove: create proof tables: %w", err)
	}
	if err := enqueueProofJobs(ctx, pool, c); err != nil {
		return err
	}
	fmt.Printf("prove: %d jobs, %d processes × %d, job time %s, lease %s, kills %d, sigterms %d\n",
		c.jobs, c.processes, c.concurrency, c.jobTime, c.lease, c.kills, c.sigterms)

	start := time.Now()
	fleet := &workerFleet{lease: c.lease, argv: func(id string) []string {
		return []string{"prove-worker", "--database-url", schemaURL, "--id", id,
			"--concurrency", fmt.Sprint(c.concurrency), "--lease", c.lease.String()}
	}}
	defer fleet.stopAll()
	for i := 0; i < c.processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}
	kills, terms, err := superviseProof(ctx, pool, fleet, cluster, c)
	if err != nil {
		return err
	}
	fleet.stopAll()
	elapsed := time.Since(start)

	res, err := audit(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Printf("proof: jobs=%d succeeded=%d dead=%d lost=%d duplicate_effects=%d overlapping_executions=%d re_executions=%d fenced_attempts=%d kills=%d sigterms=%d pauses=%d elapsed=%s\n",
		res["jobs"], res["succeeded"], res["dead"], res["lost"], res["duplicate_effects"], res["overlapping_executions"], res["re_executions"],
		res["fenced_attempts"], kills, terms, c.pauses, elapsed.Round(time.Millisecond))
	if res["lost"] != 0 || res["duplicate_effects"] != 0 || res["overlapping_executions"] != 0 {
		return errors.New("prove: the audit failed")
	}
	return nil
}

// proofDB is the database of a proof or a benchmark: a fresh schema,
// migrated, in the database at a given URL or in a throwaway cluster.
type proofDB struct {
	URL     string         // connections on it use the fresh schema
	Pool    *pgxpool.Pool  // on URL
	Cluster *devpg.Cluster // the throwaway cluster, if one was started
	closers []func()
}

// openProofDB starts a throwaway cluster when url is empty, creates a fresh
// schema, opens a pool on it and migrates it. Close drops the schema
// (unless keep) and stops the cluster.
func openProofDB(ctx context.Context, url string, keep bool) (db *proofDB, err error) {
	db = &proofDB{}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	if url == "" {
		fmt.Println("prove: starting a throwaway PostgreSQL cluster (default settings, fsync on)")
		if db.Cluster, err = devpg.Start(ctx, devpg.Options{}); err != nil {
			return nil, err
		}
		db.closers = append(db.closers, func() { db.Cluster.Stop() }) //nolint:errcheck
		url = db.Cluster.URL
	}
	schemaURL, drop, err := freshSchema(ctx, url)
	if err != nil {
		return nil, err
	}
	if !keep {
		db.closers = append(db.closers, drop)
	}
	db.URL = schemaURL
	if db.Pool, err = bench.NewPool(ctx, schemaURL); err != nil {
		return nil, err
	}
	db.closers = append(db.closers, db.Pool.Close)
	if _, err := migrations.Migrate(ctx, db.Pool); err != nil {
		return nil, err
	}
	return db, nil
}

// Close releases what openProofDB made, in reverse order.
func (db *proofDB) Close() {
	for i := len(db.closers) - 1; i >= 0; i-- {
		db.closers[i]()
	}
	db.closers = nil
}

// freshSchema creates relay_prove_<random> in the database and returns a URL
// whose connections use it, and a function that drops it.
func freshSchema(ctx context.Context, dbURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, fmt.Errorf("prove: connect: %w", err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("relay_prove_%08x", rand.Uint32())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("prove: create schema: %w", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, fmt.Errorf("prove: --database-url must be a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, dbURL); err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
			c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

func enqueueProofJobs(ctx context.Context, pool *pgxpool.Pool, c proveConfig) error {
	for done := 0; done < c.jobs; {
		n := min(5000, c.jobs-done)
		params := make([]core.EnqueueParams, n)
		for i := range params {
			ms := int(float64(c.jobTime.Milliseconds()) * (0.5 + rand.Float64()))
			params[i] = core.EnqueueParams{Args: proveArgs{Seq: done + i, Ms: ms}, Opts: &core.EnqueueOpts{Queue: proveQueue, MaxAttempts: 100}}
		}
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// superviseProof shows progress, fires the faults at evenly spaced points of
// progress, and returns when every job is final.
func superviseProof(ctx context.Context, pool *pgxpool.Pool, fleet *workerFleet, cluster *devpg.Cluster, c proveConfig) (kills, terms int, err error) {
	type fault string
	var faults []fault
	for i := 0; i < c.kills; i++ {
		faults = append(faults, "kill")
	}
	for i := 0; i < c.sigterms; i++ {
		faults = append(faults, "sigterm")
	}
	if c.pgRestart {
		faults = append(faults, "pg-restart")
	}
	if c.pgCrash {
		faults = append(faults, "pg-crash")
	}
	if c.backendKill > 0 {
		faults = append(faults, "backend-kill")
	}
	for i := 0; i < c.pauses; i++ {
		faults = append(faults, "pause")
	}
	rand.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	next := 0
	var pauses sync.WaitGroup
	tty := isTerminal()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	for {
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE kind = 'prove.job' AND state IN ('succeeded', 'dead', 'cancelled')`).Scan(&done); err != nil {
			// The server may be restarting.
			if ctx.Err() != nil {
				return kills, terms, fmt.Errorf("prove: %w", ctx.Err())
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if time.Since(lastPrint) > time.Second || done == c.jobs {
			line := fmt.Sprintf("prove: done %d/%d  kills %d/%d  sigterms %d/%d  restarts %d", done, c.jobs, kills, c.kills, terms, c.sigterms, fleet.restarts())
			if tty {
				fmt.Printf("\r%s ", line)
			} else {
				fmt.Println(line)
			}
			lastPrint = time.Now()
		}
		if done == c.jobs {
			if tty {
				fmt.Println()
			}
			pauses.Wait()
			if next < len(faults) {
				return kills, terms, fmt.Errorf("prove: the jobs finished before %d of the %d faults fired; use more jobs or a longer --job-time", len(faults)-next, len(faults))
			}
			return kills, terms, nil
		}
		// Fault i fires when progress passes (i+1)/(faults+1) of the first
		// 60% of the jobs, leaving the rest of the run to recover.
		if next < len(faults) && done >= (next+1)*c.jobs*6/10/(len(faults)+1) {
			switch faults[next] {
			case "kill":
				if err := fleet.kill(func(id string) error { return recordKill(ctx, pool, id) }); err != nil {
					return kills, terms, err
				}
				kills++
			case "sigterm":
				if err := fleet.term(); err != nil {
					return kills, terms, err
				}
				terms++
			case "pg-restart":
				fmt.Println("\nprove: restarting PostgreSQL")
				if err := cluster.Restart(ctx); err != nil {
					return kills, terms, err
				}
			case "pg-crash":
				fmt.Println("\nprove: crashing PostgreSQL (immediate shutdown)")
				if err := cluster.Crash(ctx); err != nil {
					return kills, terms, err
				}
			case "pause":
				// In the background: a pause lasts until another worker
				// takes the job over, and the other faults must not wait.
				pauses.Add(1)
				go func() {
					defer pauses.Done()
					if err := fleet.pause(ctx, pool); err != nil {
						fmt.Fprintln(os.Stderr, "prove: pause:", err)
					}
				}()
			case "backend-kill":
				go terminateBackends(ctx, pool, c.backendKill, c.backendKillD)
			}
			next++
		}
		select {
		case <-ctx.Done():
			return kills, terms, fmt.Errorf("prove: gave up: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// terminateBackends kills perSecond random worker connections every second
// for d.
func terminateBackends(ctx context.Context, pool *pgxpool.Pool, perSecond int, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = 'relay-prove-worker' ORDER BY random() LIMIT $1`, perSecond) //nolint:errcheck
		time.Sleep(time.Second)
	}
}

func audit(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	res := map[string]int64{}
	for _, block := range strings.Split(proveAudit, "-- name: ")[1:] {
		name, query, _ := strings.Cut(block, "\n")
		var n int64
		if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
			return nil, fmt.Errorf("prove: audit %s: %w", name, err)
		}
		res[strings.TrimSpace(name)] = n
	}
	return res, nil
}

// workerFleet runs a proof's worker processes: this binary, with the
// arguments argv gives for each process id.
type workerFleet struct {
	argv   func(id string) []string
	lease  time.Duration // for pause: how long a takeover can take
	mu     sync.Mutex
	cmds   []*exec.Cmd
	ids    []string
	paused map[int]bool // slots SIGSTOPped by pause: kill and term pick others
	gen    int
}

// pick returns a random slot that is not paused, and marks it paused if
// pause is set. A SIGTERM to a stopped process waits until it is continued,
// so term must not pick one.
func (f *workerFleet) pick(pause bool) (slot int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pause {
		if f.paused == nil {
			f.paused = map[int]bool{}
		}
		defer func() { f.paused[slot] = true }()
	}
	var free []int
	for slot := range f.cmds {
		if !f.paused[slot] {
			free = append(free, slot)
		}
	}
	if len(free) == 0 {
		return rand.IntN(len(f.cmds))
	}
	return free[rand.IntN(len(free))]
}

func (f *workerFleet) start(slot int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	f.gen++
	id := fmt.Sprintf("w%d-g%d", slot, f.gen)
	cmd := exec.Command(self, f.argv(id)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // our Ctrl-C is ours to relay
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("prove: start worker: %w", err)
	}
	for len(f.cmds) <= slot {
		f.cmds = append(f.cmds, nil)
		f.ids = append(f.ids, "")
	}
	f.cmds[slot], f.ids[slot] = cmd, id
	return nil
}

func (f *workerFleet) restarts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen - len(f.cmds)
}

// kill SIGKILLs a random worker, calls killed with its id once it is gone,
// and restarts it.
func (f *workerFleet) kill(killed func(id string) error) error {
	slot := f.pick(false)
	f.mu.Lock()
	cmd, id := f.cmds[slot], f.ids[slot]
	f.mu.Unlock()
	cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
	cmd.Wait()                          //nolint:errcheck
	if killed != nil {
		if err := killed(id); err != nil {
			return err
		}
	}
	return f.start(slot)
}

// killOnSchedule SIGKILLs (and restarts) a worker when progress passes the
// next of kills points spread evenly over the first 60% of total, leaving
// the rest of the run to recover. It returns the kills made so far.
func (f *workerFleet) killOnSchedule(killed, kills, progress, total int) (int, error) {
	if killed < kills && progress >= (killed+1)*total*6/10/(kills+1) {
		if err := f.kill(nil); err != nil {
			return killed, err
		}
		killed++
	}
	return killed, nil
}

// recordKill notes in the queue proof's table when a worker was dead
// (after the process is gone: its attempts ended no later).
func recordKill(ctx context.Context, pool *pgxpool.Pool, id string) error {
	for try := 0; ; try++ {
		_, err := pool.Exec(ctx, `INSERT INTO prove_kills (worker) VALUES ($1)`, id)
		if err == nil {
			break
		}
		if try > 50 {
			return fmt.Errorf("prove: record kill: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// term SIGTERMs a random worker, waits for it to drain and exit, and
// restarts it.
func (f *workerFleet) term() error {
	slot := f.pick(false)
	f.mu.Lock()
	cmd := f.cmds[slot]
	f.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("prove: worker did not exit cleanly on SIGTERM: %w", err)
	}
	return f.start(slot)
}

// pause SIGSTOPs a worker that holds a job, waits until another worker has
// claimed that job (its lease expired and it was rescued), then SIGCONTs the
// paused one: it wakes up past its lease, and the fence must refuse its
// result.
func (f *workerFleet) pause(ctx context.Context, pool *pgxpool.Pool) error {
	slot := f.pick(true)
	f.mu.Lock()
	cmd, id := f.cmds[slot], f.ids[slot]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.paused, slot)
		f.mu.Unlock()
	}()
	var jobID int64
	deadline := time.Now().Add(5 * time.Second)
	for jobID == 0 && time.Now().Before(deadline) {
		pool.QueryRow(ctx, `SELECT coalesce(min(id), 0) FROM relay_jobs WHERE state = 'claimed' AND attempted_by = $1`, id).Scan(&jobID) //nolint:errcheck
	}
	cmd.Process.Signal(syscall.SIGSTOP)       //nolint:errcheck
	defer cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck
	if jobID == 0 {
		return nil // nothing held: nothing to show
	}
	fmt.Printf("\nprove: paused %s holding job %d\n", id, jobID)
	deadline = time.Now().Add(3*f.lease + 10*time.Second)
	for time.Now().Before(deadline) {
		var taken bool
		pool.QueryRow(ctx, `SELECT attempted_by <> $2 FROM relay_jobs WHERE id = $1`, jobID, id).Scan(&taken) //nolint:errcheck
		if taken {
			fmt.Printf("prove: job %d taken over; resuming %s\n", jobID, id)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("prove: job %d was not taken over (the paused worker held its row lock); resuming %s\n", jobID, id)
	return nil
}

func (f *workerFleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cmd := range f.cmds {
		if cmd != nil && cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		}
	}
	for _, cmd := range f.cmds {
		if cmd != nil && cmd.ProcessState == nil {
			cmd.Wait() //nolint:errcheck
		}
	}
}

func isTerminal() bool {
	fi, err := os.Stdout.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
