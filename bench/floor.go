package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Floor is the System of the fewest statements a leased queue must run,
// with no library around them: a batched INSERT, a FOR UPDATE SKIP LOCKED
// claim of up to floorFetch rows setting a lease, and a batched, fenced
// completion. It is what Relay is measured against: the cost PostgreSQL on
// the same machine puts under any queue of this shape.
//
// It keeps Relay's batch sizes and durability settings (the claim's commit
// asynchronous unless WorkerConfig.SynchronousClaims, the completion's and
// the insert's synchronous; a claim of up to 1,000 rows; completions
// gathered up to 10 ms or 100 outcomes, at most 2,000 a statement) and its
// wake-up (LISTEN/NOTIFY, a notification per insert's commit, a claim per
// wake-up once the previous claim is done). It leaves out everything else
// a queue does: priorities, queues, run-at, retries, heartbeats, rescue,
// unique jobs, ordering keys, limits, metrics, tracing, job kinds.
type Floor struct{}

const (
	floorFetch       = 1000
	floorGatherMax   = 10 * time.Millisecond
	floorGatherMin   = 100
	floorBatchMax    = 2000
	floorLease       = 30 * time.Second
	floorPoll        = time.Second
	floorChannel     = "floor_jobs"
	floorCreateTable = `
CREATE TABLE IF NOT EXISTS floor_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state            smallint NOT NULL DEFAULT 0, -- 0 queued, 1 claimed, 2 succeeded
    args             jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    lease_token      uuid,
    lease_expires_at timestamptz,
    finalized_at     timestamptz
);
CREATE INDEX IF NOT EXISTS floor_jobs_queued ON floor_jobs (id) WHERE state = 0;`
	floorInsert = `INSERT INTO floor_jobs (args) SELECT unnest($1::jsonb[])`
	// The notification rides on the insert's own statement and is sent at
	// its commit.
	floorInsertOne = `WITH i AS (INSERT INTO floor_jobs (args) VALUES ($1) RETURNING id)
SELECT pg_notify('` + floorChannel + `', '') FROM i`
	floorClaim = `WITH c AS (
    SELECT id FROM floor_jobs WHERE state = 0 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
UPDATE floor_jobs j SET state = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + $2::interval
FROM c WHERE j.id = c.id
RETURNING j.id, j.lease_token, (j.args->>'s')::bigint`
	floorCompleteSQL = `UPDATE floor_jobs j SET state = 2, finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
FROM unnest($1::bigint[], $2::uuid[]) AS d(id, token)
WHERE j.id = d.id AND j.lease_token = d.token`
)

func (Floor) Name() string  { return "floor" }
func (Floor) Table() string { return "floor_jobs" }

func (Floor) Describe(cfg WorkerConfig) string {
	commit := "asynchronous"
	if cfg.SynchronousClaims {
		commit = "synchronous"
	}
	return fmt.Sprintf("%d slots + %d prefetch; claim ≤ %d rows (%s commit), completions gathered ≤ %s or %d (synchronous commit, ≤ %d a statement), LISTEN/NOTIFY a notification per insert, poll %s; no priorities, retries, heartbeats, rescue, tracing or metrics",
		cfg.Workers, cfg.Prefetch, floorFetch, commit, floorGatherMax, floorGatherMin, floorBatchMax, floorPoll)
}

func (Floor) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, floorCreateTable)
	return err
}

func (Floor) Reset(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `TRUNCATE floor_jobs`)
	return err
}

func (Floor) InsertBatch(ctx context.Context, pool *pgxpool.Pool, n int) error {
	arg, err := json.Marshal(benchArgs{Stamp: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	rows := make([]string, n)
	for i := range rows {
		rows[i] = string(arg)
	}
	_, err = pool.Exec(ctx, floorInsert, rows)
	return err
}

func (Floor) InsertOne(ctx context.Context, pool *pgxpool.Pool, stamp time.Time) error {
	arg, err := json.Marshal(benchArgs{Stamp: stamp.UnixNano()})
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, floorInsertOne, string(arg))
	return err
}

func (Floor) FillFinished(ctx context.Context, pool *pgxpool.Pool, n int) error {
	_, err := pool.Exec(ctx, `INSERT INTO floor_jobs (state, args, finalized_at)
		SELECT 2, '{"s":0}', now() FROM generate_series(1, $1)`, n)
	return err
}

func (Floor) EndToEnd(ctx context.Context, pool *pgxpool.Pool) (p50, p95, p99 time.Duration, err error) {
	return EndToEndQuery(ctx, pool, `
		SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at))
		FROM floor_jobs WHERE state = 2 AND (args->>'s')::bigint <> 0`)
}

// floorJob is one claimed row.
type floorJob struct {
	id    int64
	token [16]byte
	stamp int64
}

// Work runs a fetcher (claims when woken and slots are free), cfg.Workers
// handler goroutines and a completer, until ctx is done; then it stops
// claiming, lets the handlers finish what they hold and writes their
// outcomes.
func (f Floor) Work(ctx context.Context, pool *pgxpool.Pool, cfg WorkerConfig, hooks Hooks) error {
	listen, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	if _, err := listen.Exec(ctx, "LISTEN "+floorChannel); err != nil {
		listen.Release()
		return err
	}
	capacity := cfg.Workers + cfg.Prefetch
	jobs := make(chan floorJob, capacity)
	done := make(chan floorJob, capacity)
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var inflight atomic.Int64

	listenCtx, stopListen := context.WithCancel(ctx)
	listening := make(chan struct{})
	defer func() {
		stopListen()
		<-listening // the connection is the listener's until it returns
		listen.Release()
	}()
	go func() { // the listener: a notification wakes the fetcher
		defer close(listening)
		for {
			if _, err := listen.Conn().WaitForNotification(listenCtx); err != nil {
				return
			}
			poke()
		}
	}()

	var handlers sync.WaitGroup
	for range cfg.Workers {
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			for j := range jobs {
				hooks.Started(j.stamp)
				hooks.Worked(cfg.Job.Do())
				done <- j
			}
		}()
	}

	completerErr := make(chan error, 1)
	go func() { completerErr <- floorComplete(pool, floorCompleteSQL, done, &inflight, poke, hooks) }()

	hooks.ready()
	claimTx := pgx.TxOptions{}
	setCommit := "SET LOCAL synchronous_commit = off"
	if cfg.SynchronousClaims {
		setCommit = "SET LOCAL synchronous_commit = on"
	}
	var fetchErr error
	poke()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-wake:
		case <-time.After(floorPoll):
		}
		free := capacity - int(inflight.Load())
		if free <= 0 {
			continue
		}
		claimed, err := f.claim(ctx, pool, claimTx, setCommit, min(free, floorFetch))
		if err != nil {
			if ctx.Err() == nil {
				fetchErr = fmt.Errorf("floor claim: %w", err)
			}
			break
		}
		inflight.Add(int64(len(claimed)))
		for _, j := range claimed {
			jobs <- j
		}
		if len(claimed) == min(free, floorFetch) {
			poke() // a full claim: there may be more
		}
	}
	close(jobs)
	handlers.Wait()
	close(done)
	return errors.Join(fetchErr, <-completerErr)
}

func (Floor) claim(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, setCommit string, n int) ([]floorJob, error) {
	var out []floorJob
	err := pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setCommit); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, floorClaim, n, floorLease)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var j floorJob
			if err := rows.Scan(&j.id, &j.token, &j.stamp); err != nil {
				return err
			}
			out = append(out, j)
		}
		return rows.Err()
	})
	return out, err
}

// floorComplete writes the handlers' outcomes in gathered batches with
// statement sql (ids $1, tokens $2) until done is closed and drained.
func floorComplete(pool *pgxpool.Pool, sql string, done <-chan floorJob, inflight *atomic.Int64, freed func(), hooks Hooks) error {
	ctx := context.Background()
	var total int64
	for {
		first, ok := <-done
		if !ok {
			return nil
		}
		batch := []floorJob{first}
		deadline := time.After(floorGatherMax)
	gather:
		for len(batch) < floorGatherMin {
			select {
			case j, ok := <-done:
				if !ok {
					break gather
				}
				batch = append(batch, j)
			case <-deadline:
				break gather
			}
		}
	drain:
		for len(batch) < floorBatchMax {
			select {
			case j, ok := <-done:
				if !ok {
					break drain
				}
				batch = append(batch, j)
			default:
				break drain
			}
		}
		ids := make([]int64, len(batch))
		tokens := make([][16]byte, len(batch))
		for i, j := range batch {
			ids[i], tokens[i] = j.id, j.token
		}
		tag, err := pool.Exec(ctx, sql, ids, tokens)
		if err != nil {
			return fmt.Errorf("floor complete: %w", err)
		}
		total += tag.RowsAffected()
		inflight.Add(-int64(len(batch)))
		hooks.Completed(total)
		freed()
	}
}
