package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type sleepyArgs struct {
	Ms    int  `json:"ms"`
	Block bool `json:"block"` // run until the context is cancelled
}

func (sleepyArgs) Kind() string { return "sleepy" }

// TestHelperWorkerProcess is not a test: it is the worker process that the
// shutdown tests start (this test binary, re-executed) and signal. It runs a
// client until SIGTERM, then stops it within RELAY_HELPER_STOP and exits 0
// when every job finished, 3 when some were interrupted.
func TestHelperWorkerProcess(t *testing.T) {
	url := os.Getenv("RELAY_HELPER_URL")
	if url == "" {
		t.Skip("helper process only")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		os.Exit(10)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[sleepyArgs](func(ctx context.Context, j *core.Job[sleepyArgs]) error {
		if j.Args.Block {
			<-ctx.Done()
			return ctx.Err()
		}
		time.Sleep(time.Duration(j.Args.Ms) * time.Millisecond) // the job's work: deliberately ignores ctx
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil || c.Start(context.Background()) != nil {
		os.Exit(11)
	}
	<-ctx.Done()
	timeout, _ := time.ParseDuration(os.Getenv("RELAY_HELPER_STOP"))
	stopCtx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	os.Exit(0)
}

func runHelper(t *testing.T, url, stopTimeout string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RELAY_HELPER_URL="+url, "RELAY_HELPER_STOP="+stopTimeout)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// sigtermWhileRunning enqueues one job, starts a worker process with the
// given stop timeout, sends it SIGTERM once the job is claimed, and returns
// the process's exit code and the job as the process left it.
func sigtermWhileRunning(t *testing.T, args sleepyArgs, stopTimeout string) (int, *core.JobRow) {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	res, err := core.Enqueue(context.Background(), pool, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd := runHelper(t, url, stopTimeout)
	waitState(t, pool, res.ID, core.StateClaimed)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := exitCode(t, cmd)
	// Whatever the process records, it records before exiting: no waiting.
	j, err := core.JobGet(context.Background(), pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	return code, j
}

// SIGTERM lets the running job finish and records its success before the
// process exits.
func TestSIGTERMDrainsRunningJobs(t *testing.T) {
	t.Parallel()
	code, j := sigtermWhileRunning(t, sleepyArgs{Ms: 500}, "30s")
	if code != 0 {
		t.Fatalf("worker exited %d, want 0 (drained)", code)
	}
	if j.State != core.StateSucceeded || j.Attempt != 1 {
		t.Fatalf("after drain: state %s attempt %d", j.State, j.Attempt)
	}
}

// SIGTERM with a job that outlasts the stop timeout: the job is cancelled and
// returned to the queue at once, its attempt not counted.
func TestSIGTERMReleasesUnfinishedJobs(t *testing.T) {
	t.Parallel()
	// The job blocks until cancelled, so any stop timeout proves the point;
	// Stop keeps the last quarter of it (at most 2s) for recording the
	// release, and with 200ms (50ms to write) a loaded machine left the job
	// claimed, as did 4s (1s) under heavier load.
	code, j := sigtermWhileRunning(t, sleepyArgs{Block: true}, "8s")
	if code != 3 {
		t.Fatalf("worker exited %d, want 3 (interrupted)", code)
	}
	if j.State != core.StateQueued || j.Attempt != 0 || len(j.History) != 1 || !strings.Contains(j.History[0].Error, "interrupted") {
		t.Fatalf("after interrupted stop: %+v", j)
	}
}

// Stop returns by its deadline even when the database is unreachable, and
// reports the outcomes it could not record.
func TestStopWithDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	pool, direct, proxy := proxied(t, 0)
	ctx := context.Background()
	h, ws := newHolder()
	c, err := core.NewClient(pool, &core.Config{Workers: ws, LeaseDuration: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := core.Enqueue(ctx, direct, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	proxy.Cut()
	defer proxy.Restore()
	h.ch(res.ID) <- nil // a success that cannot be written
	stopCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(stopCtx) }()
	select {
	case err = <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return with the database unreachable")
	}
	var se *core.StopError
	if !errors.As(err, &se) || se.Unrecorded != 1 {
		t.Fatalf("Stop returned %v, want a StopError with 1 unrecorded outcome", err)
	}
}

// A graceful Stop returns prefetched jobs to the queue without starting
// them.
func TestStopDoesNotStartPrefetchedJobs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	c, err := core.NewClient(pool, &core.Config{Workers: ws,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1, Prefetch: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var params []core.EnqueueParams
	for i := range 3 {
		params = append(params, core.EnqueueParams{Args: heldArgs{N: i}})
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	first := <-h.started
	waitFor(t, "all three claimed", func() bool { return c.Stats().Claimed == 3 })
	stopped := make(chan error, 1)
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go func() { stopped <- c.Stop(stopCtx) }()
	waitFor(t, "prefetched jobs released", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND attempt = 0`) == 2
	})
	h.ch(first) <- nil
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Succeeded != 1 || s.Released != 2 {
		t.Fatalf("stats %+v, want 1 success and 2 released", s)
	}
	if len(h.started) != 0 {
		t.Fatal("a prefetched job started during the stop")
	}
}

// A clean Stop logs no warning: a rescue cut short by the stop is not a
// failure.
func TestCleanStopLogsNoWarning(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	_, ws := newHolder()
	for range 5 {
		c, err := core.NewClient(pool, &core.Config{Workers: ws, Logger: logger, RescueInterval: time.Millisecond,
			Retention: core.Retention{Interval: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The rescuer and the cleaner start at once: a stop now cuts them
		// short more often than not.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	// The one warning allowed is about the server's settings: the shared
	// development server runs with autovacuum off (core/vacuum.go).
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line != "" && !strings.Contains(line, "autovacuum is off") {
			out = append(out, line)
		}
	}
	if len(out) > 0 {
		t.Fatalf("a clean stop logged:\n%s", strings.Join(out, "\n"))
	}
}
