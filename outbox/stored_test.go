package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"

	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/testdb"
)

// logLines records what a logger was given, for tests that count lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (h *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (h *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}
func (h *logLines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logLines) WithGroup(string) slog.Handler      { return h }

// matching counts the lines containing every one of parts.
func (h *logLines) matching(parts ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
next:
	for _, l := range h.lines {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// An event whose stored headers are valid JSON of another shape (written
// behind Publish) is set aside alone: the events before and after it are
// dispatched in the same batch, it is marked failed with its decode error
// and logged once with its id, and no later dispatch reads it again; so is
// an event with an infinite published_at. A
// stored trace context of another shape costs its event only the parent
// span: it is dispatched, its error kept.
func TestUndecodableEventFailsAlone(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	logs := &logLines{}
	d, err := outbox.NewDispatcher(pool, &outbox.Config{
		Subscriptions: []outbox.Subscription{{Topic: "order.paid", Kind: "receipt"}},
		Logger:        slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 4 {
		id, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "order.paid", Key: fmt.Sprint("o-", i), Payload: payment{"o", i}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	badHeaders, badTrace := ids[1], ids[2]
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox SET headers = '{"x": 1}' WHERE id = $1`, badHeaders); err != nil {
		t.Fatal(err)
	}
	badTime, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "order.paid", Payload: payment{"o", 9}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox SET published_at = 'infinity' WHERE id = $1`, badTime); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox SET trace_context = '{"traceparent": 1}' WHERE id = $1`, badTrace); err != nil {
		t.Fatal(err)
	}

	n, err := d.DispatchOnce(ctx)
	if err != nil || n != 5 {
		t.Fatalf("DispatchOnce = %d, %v; want 5 handled (3 dispatched, 2 set aside)", n, err)
	}
	if got := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE kind = 'receipt'`); got != 3 {
		t.Errorf("%d jobs; want 3 (every event but the one set aside)", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE kind = 'receipt' AND (args->>'event_id')::bigint = $1`, badHeaders); got != 0 {
		t.Errorf("the event set aside made %d jobs", got)
	}
	var failed bool
	var jobs int
	var derr string
	if err := pool.QueryRow(ctx, `SELECT failed_at IS NOT NULL, jobs, dispatch_error FROM relay_outbox WHERE id = $1`, badHeaders).
		Scan(&failed, &jobs, &derr); err != nil {
		t.Fatal(err)
	}
	if !failed || jobs != 0 || !strings.Contains(derr, "headers") || !strings.Contains(derr, "cannot unmarshal number") {
		t.Errorf("bad headers event: failed %v, jobs %d, error %q; want failed, 0 jobs, the decode error", failed, jobs, derr)
	}
	if err := pool.QueryRow(ctx, `SELECT failed_at IS NOT NULL, jobs, dispatch_error FROM relay_outbox WHERE id = $1`, badTime).
		Scan(&failed, &jobs, &derr); err != nil {
		t.Fatal(err)
	}
	if !failed || jobs != 0 || !strings.Contains(derr, "published_at") {
		t.Errorf("infinite published_at event: failed %v, jobs %d, error %q; want failed, 0 jobs, the error", failed, jobs, derr)
	}
	if err := pool.QueryRow(ctx, `SELECT failed_at IS NOT NULL, jobs, dispatch_error FROM relay_outbox WHERE id = $1`, badTrace).
		Scan(&failed, &jobs, &derr); err != nil {
		t.Fatal(err)
	}
	if failed || jobs != 1 || !strings.Contains(derr, "trace context") {
		t.Errorf("bad trace context event: failed %v, jobs %d, error %q; want dispatched (1 job) with the decode error kept", failed, jobs, derr)
	}

	// Nothing is read again: no event left, nothing logged again.
	for range 3 {
		if n, err := d.DispatchOnce(ctx); err != nil || n != 0 {
			t.Fatalf("later DispatchOnce = %d, %v; want 0, nil", n, err)
		}
	}
	if got := logs.matching("ERROR", "set aside", fmt.Sprint("event_id=", badHeaders)); got != 1 {
		t.Errorf("%d error lines name the event set aside; want 1\n%s", got, strings.Join(logs.lines, "\n"))
	}
	if got := logs.matching("WARN", fmt.Sprint("event_id=", badTrace)); got != 1 {
		t.Errorf("%d warnings name the event without its trace context; want 1\n%s", got, strings.Join(logs.lines, "\n"))
	}
	if left, err := outbox.Undispatched(ctx, pool); err != nil || left != 0 {
		t.Errorf("Undispatched = %d, %v; want 0", left, err)
	}
}

// A stored subscription with a value a dispatcher cannot use (written
// behind Declare) costs that subscription alone: metadata that is not an
// object is dropped from its jobs, options the core refuses leave it out of
// the fan-out. The other subscriptions of the topic get their jobs, each
// problem is logged once however many dispatches read it, and
// ListSubscriptions reports it.
func TestUndecodableSubscriptionFailsAlone(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	logs := &logLines{}
	d, err := outbox.NewDispatcher(pool, &outbox.Config{
		Subscriptions: []outbox.Subscription{
			{Topic: "order.paid", Kind: "receipt"},
			{Topic: "order.paid", Kind: "ledger"},
			{Topic: "order.paid", Kind: "audit"},
		},
		Logger: slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox_subscriptions SET metadata = '[1]' WHERE kind = 'ledger'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox_subscriptions SET priority = -1 WHERE kind = 'audit'`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "order.paid", Payload: payment{"o", i}}); err != nil {
			t.Fatal(err)
		}
		if n, err := d.DispatchOnce(ctx); err != nil || n != 1 {
			t.Fatalf("DispatchOnce = %d, %v; want 1", n, err)
		}
	}
	for kind, want := range map[string]int{"receipt": 3, "ledger": 3, "audit": 0} {
		if got := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE kind = $1`, kind); got != want {
			t.Errorf("%d %s jobs; want %d", got, kind, want)
		}
	}
	for _, kind := range []string{"ledger", "audit"} {
		if got := logs.matching("WARN", "kind="+kind); got != 1 {
			t.Errorf("%d warnings name the %s subscription; want 1\n%s", got, kind, strings.Join(logs.lines, "\n"))
		}
	}
	subs, err := outbox.ListSubscriptions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		switch want := map[string]string{"ledger": "decode metadata", "audit": "Priority -1"}[s.Kind]; {
		case want == "" && s.Error != "":
			t.Errorf("%s: error %q; want none", s.Kind, s.Error)
		case !strings.Contains(s.Error, want):
			t.Errorf("%s: error %q; want it to say %q", s.Kind, s.Error, want)
		}
	}
}

// A stored payload of another shape is not the dispatcher's to decode (any
// JSON is carried as it is): the event is dispatched, and each subscriber's
// job fails its own decode (dead after its attempts, the decode error in
// last_error) while the jobs of the events around it succeed.
func TestUndecodablePayloadFailsItsJobsOnly(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[consume](func(ctx context.Context, j *core.Job[consume]) error {
		var p payment
		return j.Args.Decode(&p)
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	d, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{
		{Topic: "t", Kind: "consume", Opts: &core.EnqueueOpts{MaxAttempts: 1}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 3 {
		id, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "t", Payload: payment{"o", i}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_outbox SET payload = '"text"' WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	if n, err := d.DispatchOnce(ctx); err != nil || n != 3 {
		t.Fatalf("DispatchOnce = %d, %v; want 3", n, err)
	}
	testdb.WaitFor(t, "every job final", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state IN ('succeeded', 'dead')`) == 3
	})
	var state, lastErr string
	if err := pool.QueryRow(ctx, `SELECT state, coalesce(last_error, '') FROM relay_jobs WHERE (args->>'event_id')::bigint = $1`, ids[1]).
		Scan(&state, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state != "dead" || !strings.Contains(lastErr, "decode payload") {
		t.Errorf("the bad payload's job: %s, %q; want dead with the decode error", state, lastErr)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`); n != 2 {
		t.Errorf("%d jobs succeeded; want 2", n)
	}
}
