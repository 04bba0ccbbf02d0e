package workflow_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// updateKillWorkerDB names the database of the worker process
// TestUpdateSurvivesAWorkerKill starts.
const updateKillWorkerDB = "RELAY_UPDATE_KILL_WORKER_DB"

// updateKillSchema is the tables TestUpdateSurvivesAWorkerKill audits:
// each entry into the update's handler, by worker process, written on a
// connection of its own (committed whatever happens next); the handler's
// effect, written in its StepTx (committed only with the step's
// checkpoint); and the gate the StepTx waits on, whose row the test locks.
const updateKillSchema = `
CREATE TABLE update_kill_entered (pid int NOT NULL, address text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE update_kill_applied (run_id text NOT NULL, address text NOT NULL);
CREATE TABLE update_kill_gate (id int PRIMARY KEY);
INSERT INTO update_kill_gate VALUES (1);`

// registerUpdateKill registers the workflow of TestUpdateSurvivesAWorkerKill
// in reg: it takes one address update, validated (non-empty), and applies
// it in a StepTx that writes the address and then waits for the gate's
// row; its answer and its output are the address applied.
func registerUpdateKill(reg *workflow.Registry, pool *pgxpool.Pool) *workflow.Workflow[int, string] {
	return workflow.MustRegister(reg, "update-kill", func(wctx workflow.Context, _ int) (string, error) {
		var applied string
		_, err := workflow.HandleUpdate(wctx, "address", func(wctx workflow.Context, addr string) (string, error) {
			return workflow.StepTx(wctx, "apply-address", func(ctx context.Context, tx pgx.Tx) (string, error) {
				if _, err := pool.Exec(ctx, `INSERT INTO update_kill_entered (pid, address) VALUES ($1, $2)`, os.Getpid(), addr); err != nil {
					return "", err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO update_kill_applied (run_id, address) VALUES ($1, $2)`, wctx.RunID(), addr); err != nil {
					return "", err
				}
				if _, err := tx.Exec(ctx, `SELECT id FROM update_kill_gate WHERE id = 1 FOR UPDATE`); err != nil {
					return "", err
				}
				applied = addr
				return "applied " + addr, nil
			}, nil)
		}, &workflow.UpdateOpts[string]{Validate: func(addr string) error {
			if addr == "" {
				return errors.New("an empty address")
			}
			return nil
		}})
		return applied, err
	})
}

// TestUpdateKillWorkerProcess is not a test: it is the worker process that
// TestUpdateSurvivesAWorkerKill starts (and kills). It executes runs until
// its standard input closes.
func TestUpdateKillWorkerProcess(t *testing.T) {
	url := os.Getenv(updateKillWorkerDB)
	if url == "" {
		t.Skip("the worker process of TestUpdateSurvivesAWorkerKill")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := workflow.NewRegistry(pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 50 * time.Millisecond }),
	})
	defer reg.Close()
	registerUpdateKill(reg, pool)
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	// A short lease, so that the next worker takes over a killed one's run
	// soon.
	client, err := core.NewClient(pool, &core.Config{
		Workers: ws, LeaseDuration: 2 * time.Second, RescueInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // until the test closes it
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client.Stop(stop) //nolint:errcheck
}

// A worker process is SIGKILLed while an update's handler applies it: the
// request was taken and validated, and the handler's StepTx has written
// its effect and waits on a row the test holds locked. A new worker
// process takes the run over and handles the same request again. The
// caller's Update, waiting all along, gets the answer; by SQL, the handler
// was entered by both processes, its effect is applied once, the request
// is recorded once in the run's history, and answered once.
func TestUpdateSurvivesAWorkerKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, updateKillSchema); err != nil {
		t.Fatal(err)
	}
	startWorker := func() (*exec.Cmd, io.WriteCloser) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestUpdateKillWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), updateKillWorkerDB+"="+url)
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			in.Close()
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }() //nolint:errcheck
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill() //nolint:errcheck
			}
		})
		return cmd, in
	}

	// The gate is shut: the test holds its row until the first worker is
	// dead.
	gate, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Rollback(ctx) //nolint:errcheck
	if _, err := gate.Exec(ctx, `SELECT id FROM update_kill_gate WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	first, _ := startWorker()

	// This process starts the run and sends the update; its registry
	// executes nothing (its listener wakes Update).
	reg := workflow.NewRegistry(pool, nil)
	t.Cleanup(reg.Close)
	wf := registerUpdateKill(reg, pool)
	h, err := workflow.Start(ctx, pool, wf, 0, &workflow.StartOpts{ID: "update-kill-1"})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp string
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := workflow.Update[string](ctx, pool, reg, h.ID, "address", "1 Main St")
		answered <- answer{resp, err}
	}()

	// The handler has written its effect and waits on the gate.
	testdb.WaitFor(t, "the first worker's handler to wait on the gate", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM update_kill_entered WHERE pid = $1`, first.Process.Pid) == 1 &&
			testdb.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%update_kill_gate%'`) == 1
	})
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.Wait() //nolint:errcheck // killed
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_updates WHERE run_id = $1 AND state = 'pending'`, h.ID); n != 1 {
		t.Fatalf("%d pending updates after the kill, want the accepted one", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM update_kill_applied`); n != 0 {
		t.Fatalf("%d effects committed by the killed worker, want none", n)
	}
	select {
	case a := <-answered:
		t.Fatalf("Update returned before any worker answered: %q, %v", a.resp, a.err)
	default:
	}
	// The gate opens (the killed worker's backend, still waiting on it,
	// goes on and finds its client gone: its transaction never commits),
	// and a new worker process takes the run over once its lease expires.
	if err := gate.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	second, _ := startWorker()

	var a answer
	select {
	case a = <-answered:
	case <-ctx.Done():
		t.Fatal("Update was never answered")
	}
	if a.err != nil || a.resp != "applied 1 Main St" {
		t.Fatalf("Update answered %q, %v; want applied 1 Main St", a.resp, a.err)
	}
	if out, err := h.Result(ctx, pool); err != nil || out != "1 Main St" {
		t.Fatalf("run: %q, %v", out, err)
	}
	// The audit.
	if n := testdb.Count(t, pool, `SELECT count(DISTINCT pid) FROM update_kill_entered WHERE pid IN ($1, $2)`, first.Process.Pid, second.Process.Pid); n != 2 {
		t.Errorf("the handler was entered by %d of the two workers, want both (the kill came between accept and reply)", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM update_kill_applied WHERE run_id = $1 AND address = '1 Main St'`, h.ID); n != 1 {
		t.Errorf("the update's effect was applied %d times, want once", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'update' AND key = 'update:address#1' AND state = 'completed'`, h.ID); n != 1 {
		t.Errorf("the update is recorded %d times in the run's history, want once", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'apply-address' AND state = 'completed' AND attempts = 1`, h.ID); n != 1 {
		t.Errorf("the handler's StepTx is not recorded completed once, at one attempt counted (%d rows)", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_updates WHERE run_id = $1`, h.ID); n != 1 {
		t.Errorf("%d update rows, want 1", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_updates WHERE run_id = $1 AND state = 'completed' AND response = '"applied 1 Main St"' AND error IS NULL`, h.ID); n != 1 {
		t.Errorf("the update is not answered once with its response")
	}
}
