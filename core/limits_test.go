package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type limitedArgs struct{}

func (limitedArgs) Kind() string { return "limits.limited" }

type freeArgs struct{}

func (freeArgs) Kind() string { return "limits.free" }

type cappedAArgs struct{}

func (cappedAArgs) Kind() string { return "limits.capped_a" }

type cappedBArgs struct{}

func (cappedBArgs) Kind() string { return "limits.capped_b" }

type stripeArgs struct{}

func (stripeArgs) Kind() string { return "limits.stripe" }

type ratedArgs struct{}

func (ratedArgs) Kind() string { return "limits.rated" }

const (
	limitsChildEnv   = "RELAY_LIMITS_CHILD_URL"
	limitsChildReady = "relay-limits-child: working"
)

// TestLimitsChild is the worker process of TestGlobalLimitsAcrossProcesses:
// it runs only when started by it, with the database's URL in the
// environment, and works until its stdin closes.
func TestLimitsChild(t *testing.T) {
	url := os.Getenv(limitsChildEnv)
	if url == "" {
		t.Skip("a child process of TestGlobalLimitsAcrossProcesses")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Each handler records its window in the audit table, on its own
	// statements (committed whatever the job does).
	record := func(ctx context.Context, row *core.JobRow, d time.Duration) error {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO limit_audit (job_id, kind, queue, tags, pid, started)
			VALUES ($1, $2, $3, $4, $5, clock_timestamp()) RETURNING id`, row.ID, row.Kind, row.Queue, append([]string{}, row.Tags...), os.Getpid()).Scan(&id); err != nil {
			return err
		}
		time.Sleep(d) // the job's work
		_, err := pool.Exec(ctx, `UPDATE limit_audit SET ended = clock_timestamp() WHERE id = $1`, id)
		return err
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[limitedArgs](func(ctx context.Context, j *core.Job[limitedArgs]) error {
		return record(ctx, j.JobRow, 40*time.Millisecond)
	}))
	core.MustAddWorker(ws, core.WorkFunc[freeArgs](func(ctx context.Context, j *core.Job[freeArgs]) error {
		return record(ctx, j.JobRow, 200*time.Millisecond)
	}))
	core.MustAddWorker(ws, core.WorkFunc[cappedAArgs](func(ctx context.Context, j *core.Job[cappedAArgs]) error {
		return record(ctx, j.JobRow, 40*time.Millisecond)
	}))
	core.MustAddWorker(ws, core.WorkFunc[cappedBArgs](func(ctx context.Context, j *core.Job[cappedBArgs]) error {
		return record(ctx, j.JobRow, 40*time.Millisecond)
	}))
	core.MustAddWorker(ws, core.WorkFunc[stripeArgs](func(ctx context.Context, j *core.Job[stripeArgs]) error {
		return record(ctx, j.JobRow, 40*time.Millisecond)
	}))
	core.MustAddWorker(ws, core.WorkFunc[ratedArgs](func(ctx context.Context, j *core.Job[ratedArgs]) error {
		return record(ctx, j.JobRow, 10*time.Millisecond)
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{"default": {MaxWorkers: 10}, "capped": {MaxWorkers: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Println(limitsChildReady) // the parent enqueues once all three are working
	io.Copy(io.Discard, os.Stdin) // until the parent closes it
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c.Stop(stop)
}

// readyWriter is a child's stdout: it signals ready once the child has
// printed limitsChildReady, and discards the rest.
type readyWriter struct {
	ready chan<- struct{}
	line  []byte
	sent  bool
}

func (w *readyWriter) Write(p []byte) (int, error) {
	for _, b := range p {
		if w.sent {
			break
		}
		if b != '\n' {
			w.line = append(w.line, b)
			continue
		}
		if string(w.line) == limitsChildReady {
			w.sent = true
			w.ready <- struct{}{}
		}
		w.line = w.line[:0]
	}
	return len(p), nil
}

// Three worker processes of ten workers per queue share the database's
// limits: a kind limited to 3 never has more than 3 jobs running and
// reaches 3, while an unlimited kind of the same queue runs wider; a queue
// limited to 4 likewise, whatever its kinds; a tag limited to 2 likewise,
// whatever the kinds carrying it; a kind limited to 10 starts
// per second never starts more than 20 in any second (two windows). The
// audit reads the handlers' own start and end times.
func TestGlobalLimitsAcrossProcesses(t *testing.T) {
	if os.Getenv(limitsChildEnv) != "" {
		t.Skip()
	}
	t.Parallel()
	url := testdb.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE limit_audit (id bigserial PRIMARY KEY, job_id bigint, kind text, queue text,
		tags text[], pid int, started timestamptz, ended timestamptz)`); err != nil {
		t.Fatal(err)
	}
	for _, l := range []core.Limit{
		{Kind: "limits.limited", MaxRunning: 3},
		{Queue: "capped", MaxRunning: 4},
		{Kind: "limits.rated", Rate: 10, Per: time.Second},
		{Tag: "api:stripe", MaxRunning: 2},
	} {
		if err := core.SetLimit(ctx, pool, l); err != nil {
			t.Fatal(err)
		}
	}
	if ls, err := core.Limits(ctx, pool); err != nil || len(ls) != 4 {
		t.Fatalf("limits %+v, %v", ls, err)
	}
	var params []core.EnqueueParams
	stripe := &core.EnqueueOpts{Tags: []string{"api:stripe"}}
	for i := range 40 {
		if i%8 == 0 { // a kind limit and a tag limit on one job
			params = append(params, core.EnqueueParams{Args: limitedArgs{}, Opts: stripe})
		} else {
			params = append(params, core.EnqueueParams{Args: limitedArgs{}})
		}
		if i < 20 {
			params = append(params, core.EnqueueParams{Args: stripeArgs{}, Opts: stripe})
		}
		if i%2 == 0 {
			params = append(params, core.EnqueueParams{Args: freeArgs{}})
		}
		params = append(params, core.EnqueueParams{Args: cappedAArgs{}, Opts: &core.EnqueueOpts{Queue: "capped"}})
		if i%2 == 0 {
			params = append(params, core.EnqueueParams{Args: cappedBArgs{}, Opts: &core.EnqueueOpts{Queue: "capped"}})
		}
		if i < 30 {
			params = append(params, core.EnqueueParams{Args: ratedArgs{}})
		}
	}

	// The jobs are enqueued once every child is working: enqueued before,
	// they could all be taken by the first children to start on a loaded
	// machine, and the work would not spread over three processes.
	var children []*exec.Cmd
	ready := make(chan struct{}, 3)
	for range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLimitsChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), limitsChildEnv+"="+url)
		cmd.Stdout, cmd.Stderr = &readyWriter{ready: ready}, os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, cmd)
		t.Cleanup(func() {
			stdin.Close()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
			}
		})
	}
	for range children {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatal("the child processes did not start working")
		}
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	total := len(params)
	deadline := time.Now().Add(60 * time.Second)
	for testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) < total {
		if time.Now().After(deadline) {
			t.Fatalf("jobs not done: %d of %d succeeded", testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`), total)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The largest number of handler windows of a group open at any start.
	maxConcurrent := func(where string) int {
		return testdb.Count(t, pool, `
			SELECT coalesce(max(n), 0)::int FROM (
			    SELECT (SELECT count(*) FROM limit_audit AS b
			            WHERE `+where+` AND b.started <= a.started AND b.ended > a.started) AS n
			    FROM limit_audit AS a WHERE `+where+`) AS s`)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) - count(DISTINCT job_id) FROM limit_audit`); n != 0 {
		t.Fatalf("%d jobs ran more than once", n)
	}
	if n := testdb.Count(t, pool, `SELECT count(DISTINCT pid) FROM limit_audit`); n != 3 {
		t.Errorf("work spread over %d processes, want 3", n)
	}
	if n := maxConcurrent(`kind = 'limits.limited'`); n != 3 {
		t.Errorf("kind limited to 3 ran %d at once (it must never exceed 3, and should reach it)", n)
	}
	if n := maxConcurrent(`kind = 'limits.free'`); n <= 3 {
		t.Errorf("the unlimited kind of the same queue ran at most %d at once: the kind limit leaked", n)
	}
	if n := maxConcurrent(`'api:stripe' = ANY(tags)`); n != 2 {
		t.Errorf("tag limited to 2 ran %d at once (it must never exceed 2, and should reach it)", n)
	}
	if n := maxConcurrent(`queue = 'capped'`); n != 4 {
		t.Errorf("queue limited to 4 ran %d at once (it must never exceed 4, and should reach it)", n)
	}
	// The rate counts claims, on the database's clock: read the claims'
	// times (attempted_at), not the handlers' starts, which a loaded machine
	// delays and bunches (24 starts fell in one second so).
	if n := testdb.Count(t, pool, `
		SELECT max((SELECT count(*) FROM relay_jobs AS b
		            WHERE b.kind = 'limits.rated' AND b.attempted_at >= a.attempted_at AND b.attempted_at < a.attempted_at + interval '1 second'))::int
		FROM relay_jobs AS a WHERE a.kind = 'limits.rated'`); n > 20 {
		t.Errorf("kind limited to 10 starts per second started %d in one second (at most 20: two windows)", n)
	}
	if err := core.DeleteLimit(ctx, pool, core.Limit{Kind: "limits.rated"}); err != nil {
		t.Fatal(err)
	}
	var ve *core.ValidationError
	if err := core.SetLimit(ctx, pool, core.Limit{Queue: "q", Tag: "k"}); !errors.As(err, &ve) {
		t.Fatalf("a limit on a queue and a kind at once: %v", err)
	}
}
