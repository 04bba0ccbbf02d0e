package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/testdb"
)

func dispatcher(t *testing.T, pool *pgxpool.Pool, ns string, subs ...outbox.Subscription) *outbox.Dispatcher {
	t.Helper()
	return dispatcherLive(t, pool, ns, 2*time.Second, subs...)
}

// dispatcherLive is dispatcher with the given liveness timeout.
func dispatcherLive(t *testing.T, pool *pgxpool.Pool, ns string, liveness time.Duration, subs ...outbox.Subscription) *outbox.Dispatcher {
	t.Helper()
	d, err := outbox.NewDispatcher(pool, &outbox.Config{Namespace: ns, Subscriptions: subs, LivenessTimeout: liveness,
		PollInterval: time.Hour}) // dispatching is driven by hand below
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func active(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	list, err := outbox.ListSubscriptions(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range list {
		out[s.Kind] = s.RetiredAt == nil
	}
	return out
}

// A rolling deploy: v2 adds a subscription while v1 still runs. Whichever
// process dispatches, the event fans out to the stored set, so an event
// dispatched by v1 reaches v2's new subscriber; the subscription v2 dropped
// lives until the last v1 process is gone.
func TestSubscriptionsSharedAcrossVersions(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	receipt := outbox.Subscription{Topic: "payment.succeeded", Kind: "receipt.send"}
	audit := outbox.Subscription{Topic: "payment.succeeded", Kind: "audit.log"}
	ledger := outbox.Subscription{Topic: "payment.succeeded", Kind: "ledger.post"}
	v1 := dispatcher(t, pool, "", receipt, audit)
	if err := v1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer v1.Stop(ctx)
	// v2 adds ledger and drops audit. It declares now and starts
	// dispatching later, so v1 is the one that dispatches the first event.
	// Until it starts it does not heartbeat: its liveness timeout must
	// outlast the first dispatch, or v1 sweeps it and retires ledger (2s
	// could pass on a loaded machine).
	v2 := dispatcherLive(t, pool, "", time.Minute, receipt, ledger)
	if err := v2.Declare(ctx); err != nil {
		t.Fatal(err)
	}

	id, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Payload: payment{"o-1", 5}})
	if err != nil {
		t.Fatal(err)
	}
	undispatched := func() bool { n, err := outbox.Undispatched(ctx, pool); return err == nil && n == 0 }
	testdb.WaitFor(t, "v1 to dispatch", undispatched)
	for _, kind := range []string{"receipt.send", "audit.log", "ledger.post"} {
		if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE kind = $1 AND (args->>'event_id')::bigint = $2`, kind, id); n != 1 {
			t.Errorf("event dispatched by v1: %d %s jobs, want 1", n, kind)
		}
	}

	if err := v2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer v2.Stop(ctx)
	if err := v1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "audit.log retired once no live process declares it", func() bool { return !active(t, pool)["audit.log"] })
	if a := active(t, pool); !a["receipt.send"] || !a["ledger.post"] {
		t.Fatalf("after v1 left: %v", a)
	}
	id, err = outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Payload: payment{"o-2", 5}})
	if err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "v2 to dispatch", undispatched)
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE (args->>'event_id')::bigint = $1`, id); n != 2 {
		t.Errorf("event after the deploy made %d jobs, want 2 (receipt, ledger)", n)
	}
}

// Two services: neither retires the other's subscriptions, even when one
// is down entirely, and neither can declare one the other's live
// dispatchers declare.
func TestSubscriptionOwners(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	shop := dispatcher(t, pool, "shop", outbox.Subscription{Topic: "order.created", Kind: "invoice.make"})
	if err := shop.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mail := dispatcher(t, pool, "mail", outbox.Subscription{Topic: "order.created", Kind: "mail.send"})
	if err := mail.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer mail.Stop(ctx)
	clash := dispatcher(t, pool, "mail", outbox.Subscription{Topic: "order.created", Kind: "invoice.make"})
	if err := clash.Declare(ctx); !errors.Is(err, outbox.ErrOwned) {
		t.Fatalf("declaring shop's live subscription from mail: %v", err)
	}
	if err := shop.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Two of mail's heartbeats (each sweeps) pass.
	var before time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "mail's heartbeats", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_processes WHERE role = 'dispatcher' AND namespace = 'mail' AND heartbeat_at > $1::timestamptz + interval '600 ms'`, before) == 1
	})
	if a := active(t, pool); !a["invoice.make"] || !a["mail.send"] {
		t.Fatalf("with shop down, mail retired its subscription: %v", a)
	}
}

// A dispatcher is dead when its own liveness timeout has passed, not a
// sweeper's: one with a 2 s timeout must not retire the subscription of a
// live one with the default minute (heartbeating every 15 s).
func TestShortTimeoutDoesNotSweepALiveDispatcher(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	slow, err := outbox.NewDispatcher(pool, &outbox.Config{PollInterval: time.Hour,
		Subscriptions: []outbox.Subscription{{Topic: "t", Kind: "slow.only"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer slow.Stop(ctx)
	var t0 time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&t0); err != nil {
		t.Fatal(err)
	}
	fast := dispatcher(t, pool, "", outbox.Subscription{Topic: "t", Kind: "fast"}) // 2 s timeout
	if err := fast.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer fast.Stop(ctx)
	testdb.WaitFor(t, "the fast dispatcher to sweep well past its own timeout", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_processes WHERE role = 'dispatcher' AND heartbeat_at > $1::timestamptz + interval '4 s'`, t0) > 0
	})
	if a := active(t, pool); !a["slow.only"] {
		t.Fatalf("the live slow-heartbeat dispatcher's subscription was retired: %v", a)
	}
}

// A subscription the core cannot enqueue is refused when the dispatcher is
// made: stored, it would stop every dispatcher's every batch.
func TestUnenqueueableSubscriptionIsRefused(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]outbox.Subscription{
		"priority":     {Topic: "t", Kind: "k", Opts: &core.EnqueueOpts{Priority: new(core.MaxPriority + 1)}},
		"max attempts": {Topic: "t", Kind: "k", Opts: &core.EnqueueOpts{MaxAttempts: -1}},
		"long kind":    {Topic: "t", Kind: strings.Repeat("k", 256)},
		"long queue":   {Topic: "t", Kind: "k", Opts: &core.EnqueueOpts{Queue: strings.Repeat("q", 129)}},
		"metadata":     {Topic: "t", Kind: "k", Opts: &core.EnqueueOpts{Metadata: map[string]any{"f": func() {}}}},
	} {
		if _, err := outbox.NewDispatcher(&pgxpool.Pool{}, &outbox.Config{Subscriptions: []outbox.Subscription{s}}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A stored subscription whose metadata is not an object (a hand edit)
// loses its metadata, not the dispatch of every event.
func TestBadStoredSubscriptionMetadata(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	d := dispatcher(t, pool, "", outbox.Subscription{Topic: "t", Kind: "consume"})
	if err := d.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox_subscriptions SET metadata = '[1]'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "t", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	if n, err := d.DispatchOnce(ctx); err != nil || n != 1 {
		t.Fatalf("dispatched %d (%v); want the event", n, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE kind = 'consume'`); n != 1 {
		t.Errorf("%d jobs; want 1", n)
	}
}

// Two services declaring the same new subscription at the same moment: one
// owns it, the other gets ErrOwned — never both.
func TestConcurrentDeclarationsOfOneSubscriptionAcrossNamespaces(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for round := range 20 {
		sub := outbox.Subscription{Topic: "t", Kind: "clash." + strconv.Itoa(round)}
		var owned atomic.Int32
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for _, ns := range []string{"billing", "mail"} {
			d := dispatcher(t, pool, ns, sub)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				err := d.Declare(ctx)
				switch {
				case err == nil:
					owned.Add(1)
				case !errors.Is(err, outbox.ErrOwned):
					t.Errorf("%s: %v", ns, err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if n := owned.Load(); n != 1 {
			t.Fatalf("round %d: %d namespaces declared %s; want exactly one", round, n, sub.Kind)
		}
	}
}

// A liveness timeout that would make the heartbeat spin is refused when
// the dispatcher is made.
func TestLivenessTimeoutBelowASecondIsRefused(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewDispatcher(&pgxpool.Pool{}, &outbox.Config{LivenessTimeout: 10 * time.Millisecond,
		Subscriptions: []outbox.Subscription{{Topic: "t", Kind: "k"}}})
	if err == nil || !strings.Contains(err.Error(), "LivenessTimeout") {
		t.Fatalf("NewDispatcher with a 10ms liveness timeout: %v; want an error naming LivenessTimeout", err)
	}
}
