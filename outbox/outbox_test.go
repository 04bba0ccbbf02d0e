package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func count(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	return testdb.Count(t, pool, q, args...)
}

type payment struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

func TestPublishJoinsTheTransaction(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()

	// pgx: rollback leaves nothing, commit leaves the event.
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "payment.succeeded", Key: "o-1", Payload: payment{"o-1", 42}}); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// database/sql, the same.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Publish(ctx, stx, outbox.Event{Topic: "payment.succeeded", Payload: payment{"o-2", 7}, Headers: map[string]string{"tenant": "t1"}}); err != nil {
		t.Fatal(err)
	}
	stx.Rollback()
	if n := count(t, pool, `SELECT count(*) FROM relay_outbox`); n != 1 {
		t.Fatalf("%d events, want 1 (two rolled back)", n)
	}
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Payload: 1}); err == nil {
		t.Error("an event without a topic was accepted")
	}
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "x", Payload: func() {}}); err == nil {
		t.Error("a payload that cannot be encoded was accepted")
	}
}

func TestFanOutAndEventsWithoutSubscribers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	d, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{
		{Topic: "payment.succeeded", Kind: "receipt.send"},
		{Topic: "payment.succeeded", Kind: "ledger.post", Opts: &core.EnqueueOpts{Queue: "finance", MaxAttempts: 3}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	pay, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Key: "o-9", Payload: payment{"o-9", 10}})
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "order.created", Payload: payment{"o-9", 10}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := d.DispatchOnce(ctx)
	if err != nil || n != 2 {
		t.Fatalf("dispatched %d, %v", n, err)
	}
	if n, err := d.DispatchOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second dispatch moved %d, %v", n, err)
	}
	if c := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE (args->>'event_id')::bigint = $1`, pay); c != 2 {
		t.Errorf("payment event made %d jobs, want 2", c)
	}
	var queue, orderingKey, topic string
	var amount int
	if err := pool.QueryRow(ctx, `SELECT queue, ordering_key, args->>'topic', (args->'payload'->>'amount')::int FROM relay_jobs WHERE kind = 'ledger.post'`).
		Scan(&queue, &orderingKey, &topic, &amount); err != nil {
		t.Fatal(err)
	}
	if queue != "finance" || orderingKey != "ledger.post||o-9" || topic != "payment.succeeded" || amount != 10 {
		t.Errorf("ledger job: queue %s ordering key %s topic %s amount %d", queue, orderingKey, topic, amount)
	}
	if c := count(t, pool, `SELECT count(*) FROM relay_outbox WHERE id = $1 AND dispatched_at IS NOT NULL AND jobs = 0`, orphan); c != 1 {
		t.Errorf("an event without subscribers must stay, dispatched with 0 jobs")
	}
	if _, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{{Topic: "t", Kind: "k", Opts: &core.EnqueueOpts{OrderingKey: "x"}}}}); err == nil {
		t.Error("a subscription setting its own ordering key was accepted")
	}
}

// Eight producers publish 2,000 events, a fifth of them in transactions
// rolled back, while six dispatchers race: every committed event yields
// exactly one job per subscriber, and no rolled-back one yields any.
func TestExactlyOnceWithConcurrentDispatchers(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	ctx := context.Background()
	newPool := func() *pgxpool.Pool {
		p, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	subs := []outbox.Subscription{{Topic: "t", Kind: "a"}, {Topic: "t", Kind: "b"}}
	for range 6 {
		d, err := outbox.NewDispatcher(newPool(), &outbox.Config{Subscriptions: subs, BatchSize: 37})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Stop(context.Background()) })
	}
	pool := newPool()
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				rollback := i%5 == 0
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "t", Key: fmt.Sprintf("k%d", i%13), Payload: map[string]any{"p": p, "i": i, "rollback": rollback}}); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	testdb.WaitFor(t, "every event dispatched", func() bool {
		n, err := outbox.Undispatched(ctx, pool)
		return err == nil && n == 0
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_outbox`); n != 1600 {
		t.Fatalf("%d events committed, want 1600", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 3200 {
		t.Errorf("%d jobs, want 3200 (two per event)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM (SELECT 1 FROM relay_jobs GROUP BY args->>'event_id', kind HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d (event, subscriber) pairs got more than one job", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE (args->'payload'->>'rollback')::bool`); n != 0 {
		t.Errorf("%d jobs from rolled-back events", n)
	}
	// Within each key and subscriber, job order is event order.
	if n := count(t, pool, `
		SELECT count(*) FROM (
			SELECT (args->>'event_id')::bigint AS ev,
			       lag((args->>'event_id')::bigint) OVER (PARTITION BY ordering_key ORDER BY id) AS prev
			FROM relay_jobs) s
		WHERE ev < prev`); n != 0 {
		t.Errorf("%d jobs enqueued out of event order within their key", n)
	}
}

var errRollback = errors.New("rolled back on purpose")

type consume struct{ outbox.Delivery }

func (consume) Kind() string { return "consume" }

// A subscriber's jobs for one key run one at a time, in publish order, even
// when some fail and retry; other keys go on meanwhile.
func TestOrderPerKeyUnderRetries(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE handled (seq bigserial, key text, event bigint)`); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failed := map[int64]bool{}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[consume](func(ctx context.Context, j *core.Job[consume]) error {
		mu.Lock()
		fail := j.Args.EventID%3 == 0 && !failed[j.Args.EventID]
		failed[j.Args.EventID] = true
		mu.Unlock()
		if fail {
			return core.RetryIn(0, errors.New("first attempt fails"))
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO handled (key, event) VALUES ($1, $2)`, j.Args.Key, j.Args.EventID); err != nil {
				return err
			}
			return core.CompleteTx(ctx, tx, j)
		})
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	d, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{{Topic: "t", Kind: "consume"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	for i := range 60 {
		if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "t", Key: fmt.Sprintf("k%d", i%4), Payload: i}); err != nil {
			t.Fatal(err)
		}
	}
	testdb.WaitFor(t, "all 60 handled", func() bool { return count(t, pool, `SELECT count(*) FROM handled`) == 60 })
	if n := count(t, pool, `
		SELECT count(*) FROM (
			SELECT event, lag(event) OVER (PARTITION BY key ORDER BY seq) AS prev FROM handled) s
		WHERE event < prev`); n != 0 {
		t.Errorf("%d events handled out of publish order within their key", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT event) FROM handled`); n != 60 {
		t.Errorf("%d distinct events handled, want 60", n)
	}
}

// Dispatched events are deleted after the retention, in batches; waiting
// ones never.
func TestDeleteDispatched(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for i := range 5 {
		if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "t", Payload: i}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := outbox.NewDispatcher(pool, &outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DispatchOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "t", Payload: "waiting"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox SET dispatched_at = now() - interval '8 days' WHERE dispatched_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	for {
		n, err := outbox.DeleteDispatched(ctx, pool, 7*24*time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		total += n
		if n < 2 {
			break
		}
	}
	if total != 5 || count(t, pool, `SELECT count(*) FROM relay_outbox`) != 1 {
		t.Errorf("deleted %d, %d left; want 5 deleted and the waiting event kept", total, count(t, pool, `SELECT count(*) FROM relay_outbox`))
	}
}
