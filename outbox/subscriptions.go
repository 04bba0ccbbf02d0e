package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/liveness"
)

// Subscriptions are stored in relay_outbox_subscriptions, declared by the
// dispatchers like schedules: each dispatcher upserts its own, and fans out
// to every stored one that is not retired, so during a rolling deploy the
// old processes already deliver to a subscription the new ones added. A
// subscription belongs to a namespace (Config.Namespace) and is retired only
// when no live dispatcher of that namespace declares it.

// ErrOwned is returned when a subscription is declared in one namespace
// while a live dispatcher of another declares it.
var ErrOwned = errors.New("outbox: subscription owned by namespace")

// SubscriptionInfo is a stored subscription, as ListSubscriptions reports it.
type SubscriptionInfo struct {
	Namespace   string
	Topic       string
	Kind        string
	Endpoint    string
	Queue       string
	Priority    *int // nil: the job kind's default
	MaxAttempts int
	Metadata    json.RawMessage
	CreatedAt   time.Time
	// RetiredAt is set when no live dispatcher of the namespace declares
	// the subscription any more; it gets no more jobs.
	RetiredAt *time.Time
	// Error says what of the stored row a dispatcher cannot use (written
	// behind Declare): metadata that is not an object (its jobs go without
	// it), or options the core refuses (it gets no jobs). Empty when none.
	Error string
}

// ListSubscriptions returns every stored subscription, by topic.
func ListSubscriptions(ctx context.Context, pool *pgxpool.Pool) ([]SubscriptionInfo, error) {
	rows, err := pool.Query(ctx, sqlListSubscriptions)
	if err != nil {
		return nil, fmt.Errorf("outbox: list subscriptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SubscriptionInfo, error) {
		var i SubscriptionInfo
		var meta []byte
		err := r.Scan(&i.Namespace, &i.Topic, &i.Kind, &i.Endpoint, &i.Queue, &i.Priority, &i.MaxAttempts, &meta, &i.CreatedAt, &i.RetiredAt)
		i.Metadata = meta
		if err == nil {
			s := Subscription{Topic: i.Topic, Kind: i.Kind, Endpoint: i.Endpoint,
				Opts: &core.EnqueueOpts{Queue: i.Queue, Priority: i.Priority, MaxAttempts: i.MaxAttempts}}
			i.Error = decodeStored(&s, meta).err
		}
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list subscriptions: %w", err)
	}
	return out, nil
}

// subscriptionID is a subscription's stored identity: [topic, kind,
// endpoint] as JSON, unambiguous whatever the names contain.
func subscriptionID(s Subscription) string {
	b, _ := json.Marshal([3]string{s.Topic, s.Kind, s.Endpoint}) // strings always encode
	return string(b)
}

// Declare stores this dispatcher's subscriptions, records it as declaring
// them, and retires the namespace's subscriptions no live dispatcher
// declares, in one transaction. Start calls it, and so does the first
// DispatchOnce of a dispatcher never started; called alone, its
// declarations count for one LivenessTimeout.
func (d *Dispatcher) Declare(ctx context.Context) error {
	if err := d.proc.Declare(ctx, d.declarations()); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	d.declareMu.Lock()
	d.declared = true
	d.declareMu.Unlock()
	return nil
}

// declarations is the dispatcher's part of the declaration protocol
// (internal/liveness): its upsert of the subscriptions and its retirement.
func (d *Dispatcher) declarations() liveness.Declarations {
	return liveness.Declarations{Upsert: d.upsert, Retire: d.retire}
}

// upsert stores every declared subscription in tx; one a live dispatcher
// of another namespace declares is ErrOwned.
func (d *Dispatcher) upsert(ctx context.Context, tx pgx.Tx) error {
	for _, s := range d.cfg.Subscriptions {
		id := subscriptionID(s)
		o := core.EnqueueOpts{}
		if s.Opts != nil {
			o = *s.Opts
		}
		meta := []byte("{}")
		if len(o.Metadata) > 0 {
			var err error
			if meta, err = json.Marshal(o.Metadata); err != nil {
				return fmt.Errorf("subscription %s → %s: encode metadata: %w", s.Topic, s.Kind, err)
			}
		}
		rows, err := tx.Query(ctx, sqlDeclareSubscription, id, s.Topic, s.Kind, s.Endpoint, o.Queue, o.Priority, o.MaxAttempts,
			string(meta), d.cfg.Namespace)
		if err != nil {
			return fmt.Errorf("declare subscription %s → %s: %w", s.Topic, s.Kind, err)
		}
		stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("declare subscription %s → %s: %w", s.Topic, s.Kind, err)
		}
		if len(stored) == 0 {
			var owner string
			if err := tx.QueryRow(ctx, sqlSubscriptionOwner, id).Scan(&owner); err != nil {
				return fmt.Errorf("declare subscription %s → %s: read its owner: %w", s.Topic, s.Kind, err)
			}
			return fmt.Errorf("declare subscription %s → %s in namespace %q: %w %q, whose live dispatchers declare it",
				s.Topic, s.Kind, d.cfg.Namespace, ErrOwned, owner)
		}
	}
	return nil
}

// ensureDeclared declares once for a dispatcher used without Start.
func (d *Dispatcher) ensureDeclared(ctx context.Context) error {
	d.declareMu.Lock()
	done := d.declared
	d.declareMu.Unlock()
	if done {
		return nil
	}
	return d.Declare(ctx)
}

// retire retires the subscriptions of the namespace no live dispatcher
// declares. The caller holds the namespace lock.
func (d *Dispatcher) retire(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, sqlRetire, d.cfg.Namespace)
	if err != nil {
		return fmt.Errorf("retire undeclared subscriptions: %w", err)
	}
	retired, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var topic, kind, endpoint string
		err := r.Scan(&topic, &kind, &endpoint)
		return topic + " → " + kind + " " + endpoint, err
	})
	if err != nil {
		return fmt.Errorf("retire undeclared subscriptions: %w", err)
	}
	if len(retired) > 0 {
		d.cfg.Logger.Info("relay: retired subscriptions no live dispatcher declares",
			"namespace", d.cfg.Namespace, "subscriptions", retired)
	}
	return nil
}

// heartbeat keeps this dispatcher's declarations alive and retires what no
// live dispatcher of the namespace declares any more; one found expired
// declares again.
func (d *Dispatcher) heartbeat(ctx context.Context) {
	d.proc.KeepDeclared(ctx, d.declarations(), d.cfg.Logger, "outbox dispatcher")
}

// activeSubscriptions reads the stored fan-out in the dispatch transaction.
// A stored subscription the core would refuse (written behind Declare: a
// priority out of range, a queue name too long) is left out of the fan-out
// rather than failing the enqueue of every event; stored metadata that is
// not an object is dropped from its jobs. Either is logged once per
// dispatcher and stored value, and ListSubscriptions reports it.
func (d *Dispatcher) activeSubscriptions(ctx context.Context, tx pgx.Tx) (map[string][]Subscription, error) {
	rows, err := tx.Query(ctx, sqlActiveSubscriptions)
	if err != nil {
		return nil, err
	}
	type read struct {
		s     Subscription
		meta  []byte
		issue storedIssue
	}
	subs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (read, error) {
		var x read
		var o core.EnqueueOpts
		// A NULL priority is nil: the kind's default.
		if err := r.Scan(&x.s.Topic, &x.s.Kind, &x.s.Endpoint, &o.Queue, &o.Priority, &o.MaxAttempts, &x.meta); err != nil {
			return x, err
		}
		x.s.Opts = &o
		x.issue = decodeStored(&x.s, x.meta)
		return x, nil
	})
	if err != nil {
		return nil, err
	}
	by := map[string][]Subscription{}
	for _, x := range subs {
		if x.issue.err != "" {
			d.warnOnce(x.s, x.meta, x.issue)
		}
		if x.issue.skip {
			continue
		}
		by[x.s.Topic] = append(by[x.s.Topic], x.s)
	}
	return by, nil
}

// storedIssue is what a stored subscription's values cost it: its metadata
// (err set), or its place in the fan-out (skip).
type storedIssue struct {
	err  string
	skip bool
}

// decodeStored decodes a stored subscription's metadata into s.Opts and
// checks its options as the core will.
func decodeStored(s *Subscription, meta []byte) storedIssue {
	if len(meta) > 2 {
		if err := json.Unmarshal(meta, &s.Opts.Metadata); err != nil {
			// Not an object (a hand edit, another version's format): the
			// jobs go without it rather than the dispatch of every event
			// stopping on it.
			s.Opts.Metadata = nil
			return storedIssue{err: "decode metadata (want an object; its jobs get none): " + err.Error()}
		}
	}
	if err := validateSubscription(*s); err != nil {
		return storedIssue{err: err.Error() + " (left out of the fan-out)", skip: true}
	}
	return storedIssue{}
}

// warnOnce logs a stored subscription's issue the first time this
// dispatcher reads that stored value.
func (d *Dispatcher) warnOnce(s Subscription, meta []byte, is storedIssue) {
	o := *s.Opts
	prio := "default"
	if o.Priority != nil {
		prio = fmt.Sprint(*o.Priority)
	}
	key := fmt.Sprintf("%q|%q|%q|%q|%s|%d|%s", s.Topic, s.Kind, s.Endpoint, o.Queue, prio, o.MaxAttempts, meta)
	d.warnMu.Lock()
	seen := d.warned[key]
	if !seen {
		if d.warned == nil {
			d.warned = map[string]bool{}
		}
		d.warned[key] = true
	}
	d.warnMu.Unlock()
	if !seen {
		d.cfg.Logger.Warn("relay: outbox subscription has a stored value this dispatcher cannot use",
			"topic", s.Topic, "kind", s.Kind, "endpoint", s.Endpoint, "err", is.err)
	}
}
