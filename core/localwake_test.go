package core_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type localArgs struct{}

func (localArgs) Kind() string { return "local" }

// A started client that is the only process serving a queue wakes its own
// workers after its enqueue's commit, in the process, and sends no NOTIFY:
// the job runs although the client polls once an hour, and a listener sees
// no notification for the queue before a sentinel sent after the enqueue
// returned (an enqueue after a quiet spell sends its wake-up before it
// returns, so one sent would arrive first).
func TestOwnEnqueueWakesItsWorkersWithoutNotify(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN relay_jobs"); err != nil {
		t.Fatal(err)
	}

	ran := make(chan int64, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[localArgs](func(_ context.Context, j *core.Job[localArgs]) error {
		ran <- j.ID
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: time.Hour,
		Queues: map[string]core.QueueConfig{"alone": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)

	res, err := c.Enqueue(ctx, localArgs{}, &core.EnqueueOpts{Queue: "alone"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_notify('relay_jobs', 'sentinel')`); err != nil {
		t.Fatal(err)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("no sentinel within 30 s: %v", err)
		}
		if n.Payload == "alone" {
			t.Fatal("the enqueue notified queue alone, which no other process serves")
		}
		if n.Payload == "sentinel" {
			break
		}
	}
	select {
	case id := <-ran:
		if id != res.ID {
			t.Fatalf("ran job %d, want %d", id, res.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run within 30 s: the client's enqueue did not wake its own workers")
	}
}

const localWakeChildEnv = "RELAY_LOCALWAKE_CHILD_URL"

// TestLocalWakeChild is not a test: it is the other worker process of
// TestOwnEnqueueStillWakesOtherProcesses (this test binary, re-executed).
// It serves queue "shared", polling once an hour, records each job it runs
// with its pid in localwake_ran, says "started" on stdout, and runs until
// killed.
func TestLocalWakeChild(t *testing.T) {
	url := os.Getenv(localWakeChildEnv)
	if url == "" {
		t.Skip("child process only")
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		os.Exit(10)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[localArgs](func(ctx context.Context, j *core.Job[localArgs]) error {
		_, err := pool.Exec(ctx, `INSERT INTO localwake_ran VALUES ($1, $2)`, j.ID, os.Getpid())
		return err
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: time.Hour, ID: "localwake-child",
		Queues: map[string]core.QueueConfig{"shared": {MaxWorkers: 4}}})
	if err != nil || c.Start(context.Background()) != nil {
		os.Exit(11)
	}
	os.Stdout.WriteString("started\n")
	select {}
}

// A client's enqueue to a queue another live process also serves still
// notifies it: this process's one slot is held by the first job, and the
// other OS process, which polls once an hour and made its first claim
// before anything was enqueued, runs a job only if it is notified.
func TestOwnEnqueueStillWakesOtherProcesses(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE localwake_ran (job_id bigint, pid int)`); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestLocalWakeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), localWakeChildEnv+"="+url)
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

	release := make(chan struct{})
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[localArgs](func(ctx context.Context, j *core.Job[localArgs]) error {
		if _, err := pool.Exec(ctx, `INSERT INTO localwake_ran VALUES ($1, $2)`, j.ID, os.Getpid()); err != nil {
			return err
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: time.Hour,
		Queues: map[string]core.QueueConfig{"shared": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	defer close(release)

	for range 2 {
		if _, err := c.Enqueue(ctx, localArgs{}, &core.EnqueueOpts{Queue: "shared"}); err != nil {
			t.Fatal(err)
		}
	}
	testdb.WaitFor(t, "the other process to run a job of the shared queue", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM localwake_ran WHERE pid = $1`, cmd.Process.Pid) > 0
	})
}
