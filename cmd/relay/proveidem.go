package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/idempotency"
)

type proveIdemArgs struct {
	Seq int `json:"seq"`
}

func (proveIdemArgs) Kind() string { return "prove.idem" }

const proveIdemSchema = `
CREATE TABLE prove_idem_effects (seq int NOT NULL, job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE prove_sink_calls (seq int NOT NULL, token text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());`

// sqlProveIdemAudit: jobs, jobs finished, database effects and their
// duplicates, calls the sink received, distinct tokens, and sequence
// numbers that reached the sink with more than one token or never.
const sqlProveIdemAudit = `
SELECT
    (SELECT count(*) FROM relay_jobs WHERE kind = 'prove.idem'),
    (SELECT count(*) FROM relay_jobs WHERE kind = 'prove.idem' AND state = 'succeeded'),
    (SELECT count(*) FROM prove_idem_effects),
    (SELECT count(*) - count(DISTINCT seq) FROM prove_idem_effects),
    (SELECT count(*) FROM prove_sink_calls),
    (SELECT count(DISTINCT token) FROM prove_sink_calls),
    (SELECT count(*) FROM (SELECT seq FROM prove_sink_calls GROUP BY seq HAVING count(DISTINCT token) > 1) s),
    (SELECT count(*) FROM relay_jobs j WHERE kind = 'prove.idem'
        AND NOT EXISTS (SELECT 1 FROM prove_sink_calls c WHERE c.seq = (j.args->>'seq')::int))`

// runProveIdempotency is `relay prove idempotency`: jobs that each call a
// sink over HTTP through idempotency.External and write a database effect
// through idempotency.Once, run by worker processes that are SIGKILLed; the
// audit counts effects and tokens.
func runProveIdempotency(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove idempotency", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	jobs := fs.Int("jobs", 1000, "jobs to run")
	processes := fs.Int("processes", 3, "worker OS processes")
	concurrency := fs.Int("concurrency", 8, "jobs at once per process")
	kills := fs.Int("kill", 0, "SIGKILL a random worker process this many times, restarting it")
	sinkTime := fs.Duration("sink-time", 10*time.Millisecond, "how long the sink takes per call (±50%)")
	lease := fs.Duration("lease", time.Second, "job lease and idempotency-key lease")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *jobs < 1 || *processes < 1 || *concurrency < 1 || *kills < 0 {
		return errors.New("prove idempotency: --jobs, --processes, --concurrency must be ≥ 1, --kill ≥ 0")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	db, err := openProofDB(ctx, *dbURL, false)
	if err != nil {
		return fmt.Errorf("prove idempotency: %w", err)
	}
	defer db.Close()
	pool, schemaURL := db.Pool, db.URL
	if _, err := pool.Exec(ctx, proveIdemSchema); err != nil {
		return fmt.Errorf("prove idempotency: create proof tables: %w", err)
	}

	// The sink: an outside service, in this (never killed) process, that
	// records every call it receives.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sink := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq, err := strconv.Atoi(r.URL.Query().Get("seq"))
		token := r.Header.Get("Idempotency-Key")
		if err != nil || token == "" {
			http.Error(w, "seq and Idempotency-Key required", http.StatusBadRequest)
			return
		}
		if _, err := pool.Exec(r.Context(), `INSERT INTO prove_sink_calls (seq, token) VALUES ($1, $2)`, seq, token); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(time.Duration(float64(*sinkTime) * (0.5 + rand.Float64())))
		fmt.Fprintf(w, "accepted %d", seq)
	})}
	go sink.Serve(ln) //nolint:errcheck
	defer sink.Close()
	sinkURL := "http://" + ln.Addr().String() + "/send"

	params := make([]core.EnqueueParams, *jobs)
	for i := range params {
		params[i] = core.EnqueueParams{Args: proveIdemArgs{Seq: i}, Opts: &core.EnqueueOpts{Queue: proveQueue, MaxAttempts: 100}}
	}
	for i := 0; i < len(params); i += 5000 {
		if _, err := core.EnqueueMany(ctx, pool, params[i:min(i+5000, len(params))]); err != nil {
			return err
		}
	}
	fmt.Printf("prove: %d jobs, %d processes × %d, sink %s per call, lease %s, kills %d\n", *jobs, *processes, *concurrency, *sinkTime, *lease, *kills)

	fleet := &workerFleet{lease: *lease, argv: func(id string) []string {
		return []string{"prove-idem-worker", "--database-url", schemaURL, "--id", id, "--sink", sinkURL,
			"--concurrency", strconv.Itoa(*concurrency), "--lease", lease.String()}
	}}
	defer fleet.stopAll()
	for i := 0; i < *processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}
	start := time.Now()
	killed := 0
	lastPrint := time.Time{}
	for {
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE kind = 'prove.idem' AND state IN ('succeeded', 'dead', 'cancelled')`).Scan(&done); err != nil {
			return fmt.Errorf("prove idempotency: %w", err)
		}
		if time.Since(lastPrint) > time.Second || done == *jobs {
			fmt.Printf("prove: done %d/%d  kills %d/%d\n", done, *jobs, killed, *kills)
			lastPrint = time.Now()
		}
		if done == *jobs {
			break
		}
		if killed, err = fleet.killOnSchedule(killed, *kills, done, *jobs); err != nil {
			return err
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return fmt.Errorf("prove idempotency: gave up: %w", err)
		}
	}
	fleet.stopAll()

	var n, succeeded, effects, dupEffects, calls, tokens, multiToken, neverCalled int
	if err := pool.QueryRow(ctx, sqlProveIdemAudit).Scan(&n, &succeeded, &effects, &dupEffects, &calls, &tokens, &multiToken, &neverCalled); err != nil {
		return fmt.Errorf("prove idempotency: audit: %w", err)
	}
	fmt.Printf("prove: %d sink calls beyond one per job were repeats with the job's own token (the at-least-once window); %d jobs reached the sink with two tokens; %d never reached it\n",
		calls-tokens, multiToken, neverCalled)
	fmt.Printf("proof: idempotency jobs=%d succeeded=%d db_effects=%d duplicate_db_effects=%d sink_calls=%d distinct_tokens=%d kills=%d elapsed=%s\n",
		n, succeeded, effects, dupEffects, calls, tokens, killed, time.Since(start).Round(time.Millisecond))
	if dupEffects != 0 || tokens != n || effects != n || succeeded != n || multiToken != 0 {
		return errors.New("prove idempotency: the audit failed")
	}
	return nil
}

// idemWorker is the proof's handler: the outside call through External,
// then the database effect through Once, committed with the job's success.
type idemWorker struct {
	pool   *pgxpool.Pool
	sink   string
	client *http.Client
	lease  time.Duration
}

func (w *idemWorker) Work(ctx context.Context, job *core.Job[proveIdemArgs]) error {
	key := "job-" + strconv.Itoa(job.Args.Seq)
	_, _, err := idempotency.External(ctx, w.pool, "sink", key, func(ctx context.Context, token string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", w.sink+"?seq="+strconv.Itoa(job.Args.Seq), nil)
		if err != nil {
			return "", err
		}
		req.Header.Set("Idempotency-Key", token)
		resp, err := w.client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("sink: %s", resp.Status)
		}
		return resp.Status, nil
	}, &idempotency.Options{Lease: w.lease})
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, _, err := idempotency.Once(ctx, tx, "effects", key, func(ctx context.Context) (bool, error) {
			_, err := tx.Exec(ctx, `INSERT INTO prove_idem_effects (seq, job_id) VALUES ($1, $2)`, job.Args.Seq, job.ID)
			return true, err
		}, nil); err != nil {
			return err
		}
		return core.CompleteTx(ctx, tx, job)
	})
}

// runProveIdemWorker is one worker process of `relay prove idempotency`.
func runProveIdemWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-idem-worker", flag.ContinueOnError)
	url := fs.String("database-url", "", "PostgreSQL URL")
	id := fs.String("id", "", "worker id")
	sinkURL := fs.String("sink", "", "sink URL")
	concurrency := fs.Int("concurrency", 8, "jobs at once")
	lease := fs.Duration("lease", time.Second, "lease")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Second}
	return runProofClient(ctx, *url, *id, *concurrency, *lease, 10*time.Second, func(ws *core.Workers, pool *pgxpool.Pool) {
		core.MustAddWorker(ws, core.Worker[proveIdemArgs](&idemWorker{pool: pool, sink: *sinkURL, lease: *lease, client: client}))
	})
}
