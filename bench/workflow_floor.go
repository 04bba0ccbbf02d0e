package bench

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WorkflowFloor is the WorkflowSystem of the fewest writes a durable
// three-step run needs, with no library around them: what Relay's
// workflow package is measured against, as Floor is for its queue.
//
// A run is a row and a job, inserted by one statement (StartBatch: one
// statement for a batch). A fetcher claims up to floorFetch jobs with a
// lease in one statement (FOR UPDATE SKIP LOCKED, asynchronous commit, as
// Relay's claims), which also returns each run's input and history, so an
// execution replays what an earlier one recorded. Each of spec.Workers
// executions then writes three checkpoints, each one statement fenced by
// the job's lease (the job's row locked FOR SHARE while the token
// matches): the first before the second step runs, the second before the
// third, the third with the run's outcome. Checkpoints of executions
// running at once are grouped as Relay groups them (a write is sent at
// once while fewer than floorGroupSenders groups are in flight; writes
// arriving meanwhile go together as the next group, one pipelined batch,
// one implicit transaction, synchronous commit). The job's success is then
// written by a completer, gathered as the job floor's (up to 10 ms or 100
// outcomes, at most 2,000 a statement, synchronous commit), and the
// execution's slot is freed when its outcome has committed, as Relay's
// handler returns then.
//
// It leaves out what Relay does besides: run ids chosen by callers, the
// run's started mark and execution count, a cancel flag read with every
// write, step kinds, keys and attempt logs, retries, sleeps, signals,
// children, the announcement of outcomes to waiting callers, traces,
// heartbeats and rescue. It runs mode "queued" (and "starts") of the
// chain shape only.
type WorkflowFloor struct{}

const (
	floorGroupSenders = 4 // as Relay's checkpoint groups
	floorClaimGap     = time.Millisecond
	floorWFCreate     = `
CREATE TABLE floor_wf_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state       smallint NOT NULL DEFAULT 0, -- 0 not finished, 1 completed
    input       jsonb NOT NULL,
    output      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE TABLE floor_wf_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           bigint NOT NULL,
    state            smallint NOT NULL DEFAULT 0, -- 0 queued, 1 claimed, 2 succeeded
    lease_token      uuid,
    lease_expires_at timestamptz,
    finalized_at     timestamptz
);
CREATE INDEX floor_wf_jobs_queued ON floor_wf_jobs (id) WHERE state = 0;
CREATE TABLE floor_wf_steps (
    run_id     bigint NOT NULL,
    position   int NOT NULL,
    output     jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, position)
);`
	floorWFStart = `WITH r AS (INSERT INTO floor_wf_runs (input) VALUES ($1) RETURNING id)
INSERT INTO floor_wf_jobs (run_id) SELECT id FROM r`
	floorWFStartMany = `WITH r AS (INSERT INTO floor_wf_runs (input) SELECT unnest($1::jsonb[]) RETURNING id)
INSERT INTO floor_wf_jobs (run_id) SELECT id FROM r`
	// The claim returns each run's input and history (positions recorded),
	// so that an execution needs no read of its own.
	floorWFClaim = `WITH c AS (
    SELECT id FROM floor_wf_jobs WHERE state = 0 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED),
u AS (
    UPDATE floor_wf_jobs j SET state = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + $2::interval
    FROM c WHERE j.id = c.id
    RETURNING j.id, j.lease_token, j.run_id)
SELECT u.id, u.lease_token, u.run_id, r.input,
    ARRAY(SELECT s.position FROM floor_wf_steps s WHERE s.run_id = u.run_id ORDER BY s.position)
FROM u JOIN floor_wf_runs r ON r.id = u.run_id`
	// A checkpoint, fenced: written only while the job's lease is the
	// execution's, the job's row locked FOR SHARE until the commit.
	floorWFCheckpoint = `WITH l AS (SELECT 1 FROM floor_wf_jobs WHERE id = $1 AND lease_token = $2 FOR SHARE)
INSERT INTO floor_wf_steps (run_id, position, output) SELECT $3::bigint, $4::int, $5::jsonb FROM l`
	// The last checkpoint and the run's outcome, fenced as one.
	floorWFFinish = `WITH l AS (SELECT 1 FROM floor_wf_jobs WHERE id = $1 AND lease_token = $2 FOR SHARE),
s AS (INSERT INTO floor_wf_steps (run_id, position, output) SELECT $3::bigint, $4::int, $5::jsonb FROM l RETURNING run_id)
UPDATE floor_wf_runs r SET state = 1, output = $6::jsonb, finished_at = now() FROM s WHERE r.id = s.run_id`
	floorWFComplete = `UPDATE floor_wf_jobs j SET state = 2, finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
FROM unnest($1::bigint[], $2::uuid[]) AS d(id, token)
WHERE j.id = d.id AND j.lease_token = d.token`
)

func (WorkflowFloor) Name() string { return "floor" }

// Measures reports whether the floor has a figure for spec: the chain's
// queued drain and its starts.
func (WorkflowFloor) Measures(spec WorkflowSpec) bool {
	return (spec.Mode == "queued" || spec.Mode == "starts") && (spec.Shape == ShapeChain || spec.Shape == "")
}

func (WorkflowFloor) Describe(spec WorkflowSpec) string {
	return fmt.Sprintf("no library: a run row + job per statement; claim ≤ %d jobs with a lease (asynchronous commit, ≥ %s apart) returning input and history; "+
		"%d executions at once, three checkpoints each, one fenced statement apiece (the last with the outcome), grouped across executions as Relay's (≤ %d groups in flight, synchronous commit); "+
		"job successes gathered ≤ %s or %d (≤ %d a statement); pools: %d connections for executions, 1 claim, 1 completer",
		floorFetch, floorClaimGap, spec.Workers, floorGroupSenders, floorGatherMax, floorGatherMin, floorBatchMax, wfPoolSize(spec.Workers))
}

// wfPoolSize is the executions' pool size, as Relay's workflow bench sizes
// its workers' pool.
func wfPoolSize(workers int) int { return max(8, min(workers+4, 40)) }

type floorWFEngine struct {
	spec     WorkflowSpec
	pool     *pgxpool.Pool // starters' and the harness's
	wpool    *pgxpool.Pool // executions'
	cpool    *pgxpool.Pool // the claim's and the completer's (one connection each)
	opool    *pgxpool.Pool
	counter  StatementCounter
	progress atomic.Int64
	drop     func()
	stop     context.CancelFunc
	served   chan error
}

func (WorkflowFloor) Open(ctx context.Context, spec WorkflowSpec) (WorkflowEngine, error) {
	e := &floorWFEngine{spec: spec}
	u, drop, err := freshSchema(ctx, spec.URL, spec.Schema)
	if err != nil {
		return nil, err
	}
	e.drop = drop
	users := spec.Callers
	if spec.Mode != "latency" {
		users = max(spec.Starters, 16)
	}
	for _, p := range []struct {
		pool **pgxpool.Pool
		size int
	}{{&e.pool, max(8, min(users+4, 48))}, {&e.wpool, wfPoolSize(spec.Workers)}, {&e.cpool, 1}, {&e.opool, 1}} {
		if *p.pool, err = CountingPool(ctx, u, p.size, &e.counter); err != nil {
			e.Close()
			return nil, err
		}
	}
	if _, err := e.pool.Exec(ctx, floorWFCreate); err != nil {
		e.Close()
		return nil, fmt.Errorf("floor: create tables: %w", err)
	}
	return e, nil
}

func (e *floorWFEngine) Enqueue(ctx context.Context, shape Shape) error {
	if shape != ShapeChain {
		return fmt.Errorf("floor: no %s shape (chain only)", shape)
	}
	_, err := e.pool.Exec(ctx, floorWFStart, `"chain"`)
	return err
}

// StartBatch implements BatchStarter: n runs (rows and jobs) in one
// statement.
func (e *floorWFEngine) StartBatch(ctx context.Context, shape Shape, n int) error {
	if shape != ShapeChain {
		return fmt.Errorf("floor: no %s shape (chain only)", shape)
	}
	in := make([]string, n)
	for i := range in {
		in[i] = `"chain"`
	}
	_, err := e.pool.Exec(ctx, floorWFStartMany, in)
	return err
}

func (e *floorWFEngine) Serve(ctx context.Context) error {
	if e.stop != nil {
		return errors.New("floor: already serving")
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	e.stop, e.served = stop, make(chan error, 1)
	go func() { e.served <- e.work(wctx) }()
	return nil
}

func (e *floorWFEngine) Progress() int64 { return e.progress.Load() }

func (e *floorWFEngine) Finished(ctx context.Context) (n int64, err error) {
	err = e.pool.QueryRow(ctx, `SELECT count(*) FROM floor_wf_runs WHERE state = 1`).Scan(&n)
	return n, err
}

func (e *floorWFEngine) Call(context.Context, Shape) error {
	return errors.New("floor: no latency mode (queued and starts only)")
}

func (e *floorWFEngine) Pool() *pgxpool.Pool { return e.pool }

func (e *floorWFEngine) Statements() int64 { return e.counter.Count() }

func (e *floorWFEngine) Close() error {
	var err error
	if e.stop != nil {
		e.stop()
		err = <-e.served
		e.stop = nil
	}
	for _, p := range []*pgxpool.Pool{e.pool, e.wpool, e.cpool, e.opool} {
		if p != nil {
			p.Close()
		}
	}
	if e.drop != nil {
		e.drop()
		e.drop = nil
	}
	return err
}

// floorRun is one claimed run job.
type floorRun struct {
	job   int64
	token [16]byte
	run   int64
	input string
	done  []int32 // positions recorded by earlier executions
}

// work runs the fetcher, the executions and the completer until ctx is
// done; then it stops claiming, lets the executions finish what they hold
// and writes their jobs' successes.
func (e *floorWFEngine) work(ctx context.Context) error {
	capacity := e.spec.Workers
	runs := make(chan floorRun, capacity)
	finished := make(chan floorJob, capacity)
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var inflight atomic.Int64
	var more atomic.Bool
	var group floorGroup
	errs := make(chan error, capacity+2)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}

	var executions sync.WaitGroup
	for range capacity {
		executions.Add(1)
		go func() {
			defer executions.Done()
			for r := range runs {
				if err := e.execute(&group, r); err != nil {
					fail(err)
				}
				finished <- floorJob{id: r.job, token: r.token}
				inflight.Add(-1)
				if more.Load() {
					poke()
				}
			}
		}()
	}
	completed := make(chan error, 1)
	go func() {
		completed <- floorComplete(e.opool, floorWFComplete, finished, new(atomic.Int64), func() {}, Hooks{Completed: func(int64) {}})
	}()

	var last time.Time
	poke()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-wake:
		case <-time.After(floorPoll):
		}
		if d := floorClaimGap - time.Since(last); d > 0 {
			time.Sleep(d) // Relay's ClaimCoalesce: at most a claim a millisecond
		}
		free := capacity - int(inflight.Load())
		if free <= 0 {
			continue
		}
		last = time.Now()
		claimed, err := e.claim(ctx, min(free, floorFetch))
		if err != nil {
			if ctx.Err() == nil {
				fail(fmt.Errorf("floor: claim: %w", err))
			}
			break
		}
		inflight.Add(int64(len(claimed)))
		more.Store(len(claimed) == min(free, floorFetch))
		for _, r := range claimed {
			runs <- r
		}
		if len(claimed) == floorFetch {
			poke() // free slots are left
		}
	}
	close(runs)
	executions.Wait()
	close(finished)
	err := <-completed
	select {
	case e := <-errs:
		err = errors.Join(e, err)
	default:
	}
	return err
}

func (e *floorWFEngine) claim(ctx context.Context, n int) ([]floorRun, error) {
	var out []floorRun
	err := pgx.BeginFunc(ctx, e.cpool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, floorWFClaim, n, floorLease)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r floorRun
			if err := rows.Scan(&r.job, &r.token, &r.run, &r.input, &r.done); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// execute runs the chain's three no-op steps, replaying those history
// holds, each checkpoint committed before the next step runs.
func (e *floorWFEngine) execute(g *floorGroup, r floorRun) error {
	recorded := map[int32]bool{}
	for _, p := range r.done {
		recorded[p] = true
	}
	if r.input != `"chain"` {
		return fmt.Errorf("floor: run %d: input %q is not the chain's", r.run, r.input)
	}
	for pos := range int32(ChainSteps) {
		if recorded[pos] {
			continue // replayed: its output is history's
		}
		out := "0" // the no-op step's output
		var err error
		if pos < ChainSteps-1 {
			err = g.do(e.wpool, floorWFCheckpoint, r.job, r.token, r.run, pos, out)
		} else {
			err = g.do(e.wpool, floorWFFinish, r.job, r.token, r.run, pos, out, ChainSteps)
		}
		if err != nil {
			return fmt.Errorf("floor: run %d: checkpoint %d: %w", r.run, pos, err)
		}
	}
	e.progress.Add(1)
	return nil
}

// floorGroup groups the fenced writes of executions running at once as
// Relay's checkpoint group does: a write is sent at once while fewer than
// floorGroupSenders groups are in flight, and the writes that arrive
// meanwhile go together as the next group, one batch (one implicit
// transaction). The floor's writes never fail (nothing else takes its
// leases), so a failure fails the whole group.
type floorGroup struct {
	mu      sync.Mutex
	pending []*floorWrite
	senders int
}

type floorWrite struct {
	sql  string
	args []any
	done chan error
}

func (g *floorGroup) do(pool *pgxpool.Pool, sql string, args ...any) error {
	w := &floorWrite{sql: sql, args: args, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	if g.senders < floorGroupSenders {
		g.senders++
		calls := g.pending
		g.pending = nil
		g.mu.Unlock()
		floorSend(pool, calls)
		g.next(pool)
	} else {
		g.mu.Unlock()
	}
	return <-w.done
}

func (g *floorGroup) next(pool *pgxpool.Pool) {
	g.mu.Lock()
	if len(g.pending) == 0 {
		g.senders--
		g.mu.Unlock()
		return
	}
	calls := g.pending
	g.pending = nil
	g.mu.Unlock()
	go func() {
		floorSend(pool, calls)
		g.next(pool)
	}()
}

// floorSend sends calls as one batch and answers each: a write that
// changed no row lost its lease.
func floorSend(pool *pgxpool.Pool, calls []*floorWrite) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	for _, c := range calls {
		b.Queue(c.sql, c.args...)
	}
	br := pool.SendBatch(ctx, b)
	errs := make([]error, len(calls))
	for i := range calls {
		ct, err := br.Exec()
		if err == nil && ct.RowsAffected() != 1 {
			err = errors.New("lease lost")
		}
		errs[i] = err
	}
	cerr := br.Close()
	for i, c := range calls {
		c.done <- errors.Join(errs[i], cerr)
	}
}

// freshSchema creates schema afresh on url and returns a URL whose
// connections use it, and a function that drops it.
func freshSchema(ctx context.Context, url, schema string) (string, func(), error) {
	name := pgx.Identifier{schema}.Sanitize()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", name, name))
	conn.Close(ctx)
	if err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, url); err == nil {
			c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE") //nolint:errcheck
			c.Close(ctx)
		}
	}
	u, err := neturl.Parse(url)
	if err != nil {
		drop()
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}
