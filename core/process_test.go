package core_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/liveness"
	"github.com/relayq/relay/testkit/testdb"
)

const processChildEnv = "RELAY_PROCESS_CHILD_URL"

// TestProcessChild is not a test: it is the worker process
// TestKilledProcessEntryAgesOut starts (this test binary, re-executed) and
// kills. It starts a client serving two queues, says "started" on stdout,
// and runs until killed.
func TestProcessChild(t *testing.T) {
	url := os.Getenv(processChildEnv)
	if url == "" {
		t.Skip("child process only")
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		os.Exit(10)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[sleepyArgs](func(context.Context, *core.Job[sleepyArgs]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, LivenessTimeout: 5 * time.Second, ID: "child-worker",
		Queues: map[string]core.QueueConfig{"mail": {MaxWorkers: 3}, "default": {MaxWorkers: 2}}})
	if err != nil || c.Start(context.Background()) != nil {
		os.Exit(11)
	}
	os.Stdout.WriteString("started\n")
	select {}
}

func liveProcesses(t *testing.T, pool *pgxpool.Pool) map[int]liveness.Info {
	t.Helper()
	list, err := liveness.List(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]liveness.Info{}
	for _, p := range list {
		out[p.PID] = p
	}
	return out
}

// A worker process records its entry at Start — host, pid, version, role,
// queues with their slots, its client id — and a process killed with
// SIGKILL (no Stop) leaves an entry that stops being live after its
// liveness timeout and is deleted by the next heartbeat of a live process.
func TestKilledProcessEntryAgesOut(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), processChildEnv+"="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("child said %q (%v)", line, err)
	}

	pid := cmd.Process.Pid
	e, ok := liveProcesses(t, pool)[pid]
	if !ok {
		t.Fatalf("no live entry of pid %d after its Start returned", pid)
	}
	host, _ := os.Hostname()
	if e.Role != liveness.RoleWorker || e.Name != "child-worker" || e.Host != host || e.Version == "" ||
		e.Queues["mail"] != 3 || e.Queues["default"] != 2 || len(e.Queues) != 2 || e.Timeout != 5*time.Second {
		t.Fatalf("entry %+v; want a worker named child-worker on %s serving mail (3) and default (2), with a version", e, host)
	}

	// A live process beside it, whose heartbeats sweep.
	sweeper, err := core.NewClient(pool, &core.Config{LivenessTimeout: time.Second, RescueInterval: -1,
		Retention: core.Retention{Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sweeper.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer sweeper.Stop(context.Background())

	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no Stop, no unregister
		t.Fatal(err)
	}
	cmd.Wait()
	testdb.WaitFor(t, "the killed process's entry to stop being live", func() bool {
		_, ok := liveProcesses(t, pool)[pid]
		return !ok
	})
	testdb.WaitFor(t, "the killed process's entry to be swept", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE pid = $1`, pid) == 0
	})
	if testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE role = 'client' AND pid = $1`, os.Getpid()) != 1 {
		t.Error("the sweeping client's own entry is gone")
	}
}

// Stop deletes the client's entry: a stopped process serves nothing.
func TestStopRemovesProcessEntry(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[sleepyArgs](func(context.Context, *core.Job[sleepyArgs]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, ID: "stopping"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	live := func() int {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE name = 'stopping' AND relay_process_live(heartbeat_at, liveness_secs)`)
	}
	if n := live(); n != 1 {
		t.Fatalf("%d live entries after Start; want 1", n)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE name = 'stopping'`); n != 0 {
		t.Fatalf("%d entries after Stop; want none", n)
	}
}

// A LivenessTimeout that would make the heartbeat spin is refused.
func TestLivenessTimeoutBelowASecondIsRefused(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Second, 10 * time.Millisecond} {
		if _, err := core.NewClient(&pgxpool.Pool{}, &core.Config{LivenessTimeout: d}); err == nil {
			t.Errorf("LivenessTimeout %s accepted", d)
		}
	}
}
