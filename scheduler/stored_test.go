package scheduler_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

// errorLines records the schedule named by each ERROR log record.
type errorLines struct {
	mu    sync.Mutex
	names map[string]int
}

func (h *errorLines) Enabled(context.Context, slog.Level) bool { return true }
func (h *errorLines) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "schedule" {
			h.mu.Lock()
			h.names[a.Value.String()]++
			h.mu.Unlock()
		}
		return true
	})
	return nil
}
func (h *errorLines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLines) WithGroup(string) slog.Handler      { return h }

func (h *errorLines) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.names[name]
}

// Stored schedule values of the wrong shape, written behind Declare, fail
// their own schedule only. Options the core refuses (a priority out of
// range, a queue name too long), metadata or args that are not objects, a
// next fire of -infinity: the schedule is marked with the error (List and
// the admin API show it),
// logged once, left alone until its recheck, and fires nothing. Args that
// are an object of another shape are not the scheduler's to decode: the
// schedule fires, and its job fails its own decode (dead after its
// attempts, the error in last_error). A next fire of +infinity is never
// due and costs nothing. A healthy schedule beside them fires throughout.
func TestUndecodableScheduleFailsAlone(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_schedules (name, spec, timezone, kind, args, queue, priority, max_attempts,
		                             catch_up, catch_up_limit, overlap, next_fire_at, namespace, metadata)
		SELECT name, '@every 1h', 'UTC', 'report', args::jsonb, queue, priority, 1,
		       'latest', 100, 'allow', coalesce(next::timestamptz, now() - interval '1 minute'), 'other', metadata::jsonb
		FROM (VALUES ('bad-priority', '{}', 'default', -1, '{}', NULL),
		             ('bad-queue', '{}', repeat('q', 200), 1, '{}', NULL),
		             ('bad-metadata', '{}', 'default', 1, '"text"', NULL),
		             ('args-not-object', '"text"', 'default', 1, '{}', NULL),
		             ('bad-args', '{"region": 5}', 'default', 1, '{}', NULL),
		             ('past-forever', '{}', 'default', 1, '{}', '-infinity'),
		             ('never', '{}', 'default', 1, '{}', 'infinity')) AS v(name, args, queue, priority, metadata, next)`); err != nil {
		t.Fatal(err)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[reportArgs](func(context.Context, *core.Job[reportArgs]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	logs := &errorLines{names: map[string]int{}}
	start(t, pool, &scheduler.Config{
		Schedules:    []scheduler.Schedule{{Name: "tick", Spec: "@every 1s", Args: reportArgs{}}},
		PollInterval: 50 * time.Millisecond,
		Logger:       slog.New(logs),
	})
	waitFor(t, "three fires of the healthy schedule", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE schedule = 'tick'`) >= 3
	})
	defer func() {
		if t.Failed() {
			rows, _ := pool.Query(ctx, `SELECT id, kind, state, args::text, metadata::text, coalesce(last_error, '') FROM relay_jobs`)
			for rows.Next() {
				var id int64
				var k, st, a, m, e string
				rows.Scan(&id, &k, &st, &a, &m, &e)
				t.Log(id, k, st, a, m, e)
			}
			rows.Close()
		}
	}()
	waitFor(t, "the job of the bad args to end", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE metadata->>'relay.schedule' = 'bad-args' AND state = 'dead'`) == 1
	})

	want := map[string]string{"bad-priority": "priority", "bad-queue": "queue", "bad-metadata": "metadata", "args-not-object": "args",
		"past-forever": "next_fire_at"}
	list, err := scheduler.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		msg, broken := want[i.Name]
		switch {
		case broken && (!strings.Contains(strings.ToLower(i.BrokenError), msg) || i.BrokenAt == nil || i.LastFireAt != nil):
			t.Errorf("%s: broken %q at %v, last fire %v; want marked with its %s error, not fired", i.Name, i.BrokenError, i.BrokenAt, i.LastFireAt, msg)
		case i.Name == "never":
			if i.BrokenError != "" || i.LastFireAt != nil {
				t.Errorf("never: broken %q, last fire %v; want neither (it is never due)", i.BrokenError, i.LastFireAt)
			}
		case !broken && (i.BrokenError != "" || i.LastFireAt == nil):
			t.Errorf("%s: broken %q, last fire %v; want fired", i.Name, i.BrokenError, i.LastFireAt)
		}
	}
	for name := range want {
		if n := logs.count(name); n != 1 {
			t.Errorf("%s: %d error lines; want 1 (no retry before its recheck)", name, n)
		}
		if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE metadata->>'relay.schedule' = $1`, name); n != 0 {
			t.Errorf("%s: %d jobs; want none", name, n)
		}
	}
	var lastErr string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM relay_jobs WHERE metadata->>'relay.schedule' = 'bad-args'`).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "decode args") {
		t.Errorf("the bad args' job: last_error %q; want the decode error", lastErr)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE metadata->>'relay.schedule' = 'tick' AND state = 'dead'`); n != 0 {
		t.Errorf("%d of the healthy schedule's jobs dead", n)
	}
}
