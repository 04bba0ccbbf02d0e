package scheduler_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

func every(name string) scheduler.Schedule {
	return scheduler.Schedule{Name: name, Spec: "@every 1h", Args: reportArgs{}}
}

func enabled(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	list, err := scheduler.List(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, i := range list {
		out[i.Name] = i.DisabledAt == nil
	}
	return out
}

// heartbeats waits until the scheduler processes of a namespace have
// heartbeated n more times in total (each one also runs the retirement
// sweep).
func heartbeats(t *testing.T, pool *pgxpool.Pool, ns string, n int) {
	t.Helper()
	q := `SELECT coalesce(max(heartbeat_at), 'epoch') FROM relay_processes WHERE role = 'scheduler' AND namespace = $1`
	var last time.Time
	for range n {
		var before time.Time
		if err := pool.QueryRow(context.Background(), q, ns).Scan(&before); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a heartbeat", func() bool {
			if err := pool.QueryRow(context.Background(), q, ns).Scan(&last); err != nil {
				t.Fatal(err)
			}
			return last.After(before)
		})
	}
}

// The case: processes declaring {a, shared} and {b, shared} side by
// side (a rolling deploy in one namespace). Neither disables the other's
// schedule; a schedule is retired only once no live process declares it.
func TestRollingDeployKeepsEverySchedule(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	// Short, but a live process stalled this long by a loaded machine is
	// swept by the other (heartbeats every quarter of it): 2s was tight.
	fast := 5 * time.Second
	v1 := start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("a"), every("shared"), every("old")}, LivenessTimeout: fast})
	// v2 adds "b" and drops "old" while v1 still runs.
	v2 := start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("b"), every("shared"), every("a")}, LivenessTimeout: fast})
	heartbeats(t, pool, "default", 2)
	if e := enabled(t, pool); !e["a"] || !e["b"] || !e["shared"] || !e["old"] {
		t.Fatalf("with v1 and v2 running: enabled %v; want all four", e)
	}
	// Restarting v1 (as a process of the old version might) changes nothing.
	stop(t, v1)
	v1 = start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("a"), every("shared"), every("old")}, LivenessTimeout: fast})
	if e := enabled(t, pool); !e["b"] || !e["old"] {
		t.Fatalf("after v1 restarted: enabled %v", e)
	}
	// The last v1 process goes: "old" is declared by no live process.
	stop(t, v1)
	waitFor(t, `"old" retired`, func() bool { return !enabled(t, pool)["old"] })
	if e := enabled(t, pool); !e["a"] || !e["b"] || !e["shared"] {
		t.Fatalf("after v1 left: enabled %v", e)
	}
	_ = v2
}

// A process killed without Stop keeps its schedules alive for the liveness
// timeout only.
func TestDeadProcessDeclarationsExpire(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// Short, but not so short that the check below, made right after
	// another process starts, can come after it on a loaded machine (2s
	// could).
	fast := 5 * time.Second
	gone, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("only-gone")}, LivenessTimeout: fast})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Declare(ctx); err != nil { // declares, never heartbeats: as if killed
		t.Fatal(err)
	}
	start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("kept")}, LivenessTimeout: fast})
	if e := enabled(t, pool); !e["only-gone"] {
		t.Fatalf("retired while its process is within the timeout: %v", e)
	}
	waitFor(t, "the dead process's schedule retired", func() bool { return !enabled(t, pool)["only-gone"] })
}

// Two services over one database, each its own namespace: neither retires
// the other's schedules, even when one stops entirely, and neither can take
// a name the other's live processes declare.
func TestTwoServicesOwnTheirSchedules(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fast := 2 * time.Second
	billing := start(t, pool, &scheduler.Config{Namespace: "billing", Schedules: []scheduler.Schedule{every("invoice")}, LivenessTimeout: fast})
	start(t, pool, &scheduler.Config{Namespace: "mail", Schedules: []scheduler.Schedule{every("digest")}, LivenessTimeout: fast})

	clash, err := scheduler.New(pool, &scheduler.Config{Namespace: "mail", Schedules: []scheduler.Schedule{every("invoice")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := clash.Declare(ctx); !errors.Is(err, scheduler.ErrOwned) {
		t.Fatalf("declaring billing's live schedule from mail: %v; want ErrOwned", err)
	}

	stop(t, billing) // the whole billing service is down
	heartbeats(t, pool, "mail", 2)
	if e := enabled(t, pool); !e["invoice"] || !e["digest"] {
		t.Fatalf("with billing down, mail retired its schedule: %v", e)
	}
	list, err := scheduler.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		if want := map[string]string{"invoice": "billing", "digest": "mail"}[i.Name]; i.Namespace != want {
			t.Errorf("%s owned by %q, want %q", i.Name, i.Namespace, want)
		}
	}
}

// countHandler counts log records at ERROR.
type countHandler struct{ errors atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.errors.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// A stored schedule this process cannot evaluate (a zone its tzdata lacks,
// a spec from a newer version) or cannot fire (stored metadata that is not
// an object) is left alone and marked, not retried in a loop, and does not
// roll back the other schedules' fires: the healthy schedule beside them
// keeps firing while each broken one costs one error line. (Stored JSON
// null metadata is no object either, but fires: it used to panic.)
func TestUnevaluableScheduleDoesNotSpin(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_schedules (name, spec, timezone, kind, args, queue, priority, max_attempts,
		                             catch_up, catch_up_limit, overlap, next_fire_at, namespace, metadata)
		VALUES ('mars', '0 9 * * *', 'Mars/Olympus_Mons', 'report', '{}', 'default', 1, 25,
		        'latest', 100, 'allow', now() - interval '1 minute', 'other', '{}'),
		       ('future', '@fortnightly', 'UTC', 'report', '{}', 'default', 1, 25,
		        'latest', 100, 'allow', now() - interval '1 minute', 'other', '{}'),
		       ('array-meta', '@every 1h', 'UTC', 'report', '{}', 'default', 1, 25,
		        'latest', 100, 'allow', now() - interval '1 minute', 'other', '[1]'),
		       ('null-meta', '@every 1h', 'UTC', 'report', '{}', 'default', 1, 25,
		        'latest', 100, 'allow', now() - interval '1 minute', 'other', 'null')`); err != nil {
		t.Fatal(err)
	}
	h := &countHandler{}
	start(t, pool, &scheduler.Config{
		Schedules:    []scheduler.Schedule{{Name: "tick", Spec: "@every 1s", Args: reportArgs{}}},
		PollInterval: 50 * time.Millisecond,
		Logger:       slog.New(h),
	})
	waitFor(t, "three fires of the healthy schedule", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE schedule = 'tick'`) >= 3
	})
	if n := h.errors.Load(); n != 3 {
		t.Errorf("%d error lines; want one per broken schedule", n)
	}
	list, err := scheduler.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		switch i.Name {
		case "mars", "future", "array-meta":
			if i.BrokenError == "" || i.BrokenAt == nil || i.DisabledAt != nil {
				t.Errorf("%s: broken %q at %v, disabled %v; want marked, not disabled", i.Name, i.BrokenError, i.BrokenAt, i.DisabledAt)
			}
		case "tick", "null-meta":
			if i.BrokenError != "" || i.LastFireAt == nil {
				t.Errorf("%s: broken %q, last fire %v; want fired", i.Name, i.BrokenError, i.LastFireAt)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE metadata->>'relay.schedule' IN ('mars', 'future', 'array-meta')`); n != 0 {
		t.Errorf("%d jobs from unevaluable schedules", n)
	}
}

// A process is dead when its own liveness timeout has passed, not a
// sweeper's: a process with a 2 s timeout (heartbeating twice a second)
// must not retire the schedule of a live one with the default minute
// (heartbeating every 15 s) between two of its heartbeats.
func TestShortTimeoutDoesNotSweepALiveProcess(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("slow-only"), every("shared")}})
	var t0 time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&t0); err != nil {
		t.Fatal(err)
	}
	start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("shared")}, LivenessTimeout: 2 * time.Second})
	waitFor(t, "the fast process to sweep well past its own timeout", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_processes WHERE role = 'scheduler' AND heartbeat_at > $1::timestamptz + interval '4 s'`, t0) > 0
	})
	if e := enabled(t, pool); !e["slow-only"] {
		t.Fatalf("the live slow-heartbeat process's schedule was retired: %v", e)
	}
}

// Stop is bounded even when the database stops answering: unregistering
// the process honours Stop's context (and a few seconds at most after it).
func TestStopIsBoundedWhenTheDatabaseHangs(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+ln.Addr().String()+"/x")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{every("a")}})
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Declare(dctx); err == nil {
		t.Fatal("declared against a server that never answers")
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		done <- s.Stop(ctx)
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Stop reported success; want the failed unregister")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return with the database hanging")
	}
}

// Two services declaring the same new name at the same moment: one owns
// it, the other gets ErrOwned — never both, each believing it declares a
// row that holds only one of their specs.
func TestConcurrentDeclarationsOfOneNameAcrossNamespaces(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for round := range 20 {
		name := "clash-" + strconv.Itoa(round)
		var owned atomic.Int32
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for _, ns := range []string{"billing", "mail"} {
			s, err := scheduler.New(pool, &scheduler.Config{Namespace: ns, Schedules: []scheduler.Schedule{every(name)}})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				err := s.Declare(ctx)
				switch {
				case err == nil:
					owned.Add(1)
				case !errors.Is(err, scheduler.ErrOwned):
					t.Errorf("%s: %v", ns, err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if n := owned.Load(); n != 1 {
			t.Fatalf("round %d: %d namespaces declared %s; want exactly one", round, n, name)
		}
	}
}

// A liveness timeout that would make the heartbeat spin is refused by New.
func TestLivenessTimeoutBelowASecondIsRefused(t *testing.T) {
	t.Parallel()
	_, err := scheduler.New(&pgxpool.Pool{}, &scheduler.Config{LivenessTimeout: 10 * time.Millisecond,
		Schedules: []scheduler.Schedule{every("a")}})
	if err == nil || !strings.Contains(err.Error(), "LivenessTimeout") {
		t.Fatalf("New with a 10ms liveness timeout: %v; want an error naming LivenessTimeout", err)
	}
}
