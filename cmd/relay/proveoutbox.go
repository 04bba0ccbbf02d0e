package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
)

const proveOutboxSchema = `
CREATE TABLE prove_orders (id bigserial PRIMARY KEY, key text NOT NULL);
CREATE TABLE prove_outbox_effects (seq bigserial, event_id bigint NOT NULL, key text NOT NULL, job_id bigint NOT NULL);`

// sqlProveOutboxAudit: events committed; distinct events delivered; events
// never delivered; deliveries beyond one per event; deliveries handled
// before an earlier event of their key; events whose business row is
// missing (published outside a committed transaction).
const sqlProveOutboxAudit = `
WITH e AS (SELECT event_id, key, seq, lag(event_id) OVER (PARTITION BY key ORDER BY seq) AS prev FROM prove_outbox_effects)
SELECT
    (SELECT count(*) FROM relay_outbox WHERE topic = 'prove.event'),
    (SELECT count(DISTINCT event_id) FROM prove_outbox_effects),
    (SELECT count(*) FROM relay_outbox o WHERE topic = 'prove.event'
        AND NOT EXISTS (SELECT 1 FROM prove_outbox_effects f WHERE f.event_id = o.id)),
    (SELECT count(*) - count(DISTINCT event_id) FROM prove_outbox_effects),
    (SELECT count(*) FROM e WHERE event_id < prev),
    (SELECT count(*) FROM relay_outbox o WHERE topic = 'prove.event'
        AND NOT EXISTS (SELECT 1 FROM prove_orders b WHERE b.id = (o.payload->>'order')::bigint))`

type proveConsume struct{ outbox.Delivery }

func (proveConsume) Kind() string { return "prove.consume" }

// runProveOutbox is `relay prove outbox`: producers publish events in
// business transactions (some rolled back) while worker processes, each
// running a dispatcher and workers, are SIGKILLed; the audit checks every
// committed event was delivered once, in order per key.
func runProveOutbox(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove outbox", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	events := fs.Int("events", 3000, "events to attempt to publish")
	keys := fs.Int("keys", 20, "distinct event keys")
	producers := fs.Int("producers", 4, "concurrent publishing goroutines")
	rollbackPct := fs.Int("rollback", 10, "percent of business transactions rolled back on purpose")
	processes := fs.Int("processes", 3, "worker OS processes (each runs a dispatcher and workers)")
	concurrency := fs.Int("concurrency", 8, "jobs at once per process")
	kills := fs.Int("kill", 0, "SIGKILL a random worker process this many times, restarting it")
	lease := fs.Duration("lease", time.Second, "job lease")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *events < 1 || *keys < 1 || *producers < 1 || *processes < 1 || *kills < 0 || *rollbackPct < 0 || *rollbackPct > 100 {
		return errors.New("prove outbox: --events, --keys, --producers, --processes ≥ 1; --kill ≥ 0; --rollback 0..100")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	db, err := openProofDB(ctx, *dbURL, false)
	if err != nil {
		return fmt.Errorf("prove outbox: %w", err)
	}
	defer db.Close()
	pool := db.Pool
	if _, err := pool.Exec(ctx, proveOutboxSchema); err != nil {
		return fmt.Errorf("prove outbox: create proof tables: %w", err)
	}
	fmt.Printf("prove: %d events over %d keys from %d producers (%d%% rolled back), %d processes × %d, kills %d\n",
		*events, *keys, *producers, *rollbackPct, *processes, *concurrency, *kills)

	fleet := &workerFleet{lease: *lease, argv: func(id string) []string {
		return []string{"prove-outbox-worker", "--database-url", db.URL, "--id", id,
			"--concurrency", strconv.Itoa(*concurrency), "--lease", lease.String()}
	}}
	defer fleet.stopAll()
	for i := 0; i < *processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}

	start := time.Now()
	var attempted, rolledBack atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, *producers)
	for range *producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempted.Add(1) <= int64(*events) {
				key := "k" + strconv.Itoa(rand.IntN(*keys))
				rollback := rand.IntN(100) < *rollbackPct
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var order int64
					if err := tx.QueryRow(ctx, `INSERT INTO prove_orders (key) VALUES ($1) RETURNING id`, key).Scan(&order); err != nil {
						return err
					}
					if _, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "prove.event", Key: key, Payload: map[string]int64{"order": order}}); err != nil {
						return err
					}
					if rollback {
						return errProveRollback
					}
					return nil
				})
				switch {
				case errors.Is(err, errProveRollback):
					rolledBack.Add(1)
				case err != nil:
					errc <- err
					return
				}
			}
		}()
	}

	killed := 0
	producing := true
	lastPrint := time.Time{}
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("prove outbox: publish: %w", err)
		default:
		}
		if producing && attempted.Load() >= int64(*events) {
			wg.Wait()
			producing = false
		}
		var published, done, pending int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM relay_outbox),
			(SELECT count(*) FROM relay_jobs WHERE kind = 'prove.consume' AND state = 'succeeded'),
			(SELECT count(*) FROM relay_outbox WHERE dispatched_at IS NULL)`).Scan(&published, &done, &pending); err != nil {
			return fmt.Errorf("prove outbox: %w", err)
		}
		if time.Since(lastPrint) > time.Second {
			fmt.Printf("prove: published %d  delivered %d  undispatched %d  kills %d/%d\n", published, done, pending, killed, *kills)
			lastPrint = time.Now()
		}
		if !producing && pending == 0 && done == published {
			break
		}
		if killed, err = fleet.killOnSchedule(killed, *kills, published, *events); err != nil {
			return err
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return fmt.Errorf("prove outbox: gave up: %w", err)
		}
	}
	fleet.stopAll()

	var published, delivered, lost, dups, outOfOrder, orphans int
	if err := pool.QueryRow(ctx, sqlProveOutboxAudit).Scan(&published, &delivered, &lost, &dups, &outOfOrder, &orphans); err != nil {
		return fmt.Errorf("prove outbox: audit: %w", err)
	}
	fmt.Printf("proof: outbox published=%d rolled_back=%d delivered=%d lost=%d duplicates=%d out_of_order=%d kills=%d elapsed=%s\n",
		published, rolledBack.Load(), delivered, lost, dups, outOfOrder, killed, time.Since(start).Round(time.Millisecond))
	if lost != 0 || dups != 0 || outOfOrder != 0 || orphans != 0 || delivered != published {
		return errors.New("prove outbox: the audit failed")
	}
	return nil
}

var errProveRollback = errors.New("rolled back on purpose")

// runProveOutboxWorker is one process of `relay prove outbox`: a
// dispatcher, and workers whose handler records the delivery in the same
// transaction as the job's success (failing the first attempt of every
// seventh event, to put retries in the way of the order).
func runProveOutboxWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-outbox-worker", flag.ContinueOnError)
	url := fs.String("database-url", "", "PostgreSQL URL")
	id := fs.String("id", "", "worker id")
	concurrency := fs.Int("concurrency", 8, "jobs at once")
	lease := fs.Duration("lease", time.Second, "lease")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return runProofClient(ctx, *url, *id, *concurrency, *lease, 10*time.Second, func(ws *core.Workers, pool *pgxpool.Pool) {
		d, err := outbox.NewDispatcher(pool, &outbox.Config{
			Subscriptions: []outbox.Subscription{{Topic: "prove.event", Kind: "prove.consume", Opts: &core.EnqueueOpts{Queue: proveQueue, MaxAttempts: 100}}},
			BatchSize:     200,
			PollInterval:  200 * time.Millisecond,
		})
		if err == nil {
			err = d.Start(ctx)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "prove-outbox-worker: dispatcher:", err)
			os.Exit(1)
		}
		core.MustAddWorker(ws, core.WorkFunc[proveConsume](func(ctx context.Context, j *core.Job[proveConsume]) error {
			if j.Args.EventID%7 == 0 && j.Attempt == 1 {
				return core.RetryIn(0, errors.New("first attempt fails on purpose"))
			}
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO prove_outbox_effects (event_id, key, job_id) VALUES ($1, $2, $3)`,
					j.Args.EventID, j.Args.Key, j.ID); err != nil {
					return err
				}
				return core.CompleteTx(ctx, tx, j)
			})
		}))
	})
}
