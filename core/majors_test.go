package core_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
)

type bytesArgs struct {
	Mode string `json:"mode"`
}

func (bytesArgs) Kind() string { return "fail_with_bytes" }

// Error messages, stacks and panic values holding invalid UTF-8 or NUL
// bytes are recorded (sanitised), not lost to a failed write.
func TestFailureWithInvalidBytesIsRecorded(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[bytesArgs](func(ctx context.Context, j *core.Job[bytesArgs]) error {
		if j.Args.Mode == "panic" {
			panic("boom \x00 \xff\xfe")
		}
		return errors.New("bad bytes \xff\xfe and a nul \x00 here")
	}))
	// A long lease: a lost failure write would show as "lease expired" only
	// after it, so the wait below would time out instead.
	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Hour})
	for _, mode := range []string{"error", "panic"} {
		res, err := core.Enqueue(ctx, pool, bytesArgs{Mode: mode}, &core.EnqueueOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		j := waitState(t, pool, res.ID, core.StateDead)
		if strings.Contains(j.LastError, "lease expired") || !strings.Contains(j.LastError, "\uFFFD") || !strings.Contains(j.LastError, `\x00`) {
			t.Fatalf("%s: last_error = %q", mode, j.LastError)
		}
		if len(j.History) != 1 || j.History[0].Error != j.LastError {
			t.Fatalf("%s: history = %+v", mode, j.History)
		}
		if mode == "panic" && !strings.Contains(j.LastError, "panicked") {
			t.Fatalf("panic not recorded as one: %q", j.LastError)
		}
	}
}

// Priority 0 overrides a kind's default priority; nil keeps it.
func TestPriorityZeroOverridesKindDefault(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	zero, _ := core.Enqueue(ctx, pool, withDefaults{}, &core.EnqueueOpts{Priority: new(0)})
	unset, _ := core.Enqueue(ctx, pool, withDefaults{}, &core.EnqueueOpts{Queue: "other"})
	if j, _ := core.JobGet(ctx, pool, zero.ID); j == nil || j.Priority != 0 || j.Queue != "reports" {
		t.Fatalf("priority 0 did not override the kind's 5: %+v", j)
	}
	if j, _ := core.JobGet(ctx, pool, unset.ID); j == nil || j.Priority != 5 {
		t.Fatalf("unset priority lost the kind's default: %+v", j)
	}
}

type kindArgs struct{ kind string }

func (k kindArgs) Kind() string { return k.kind }

// Every numeric option is range-checked in Go, on the single, the JSON
// batch and the COPY batch paths alike; text with NUL bytes and run-at
// years PostgreSQL cannot store are *ValidationError too. Nothing is
// written.
func TestEnqueueValidatesEveryRange(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		args  core.JobArgs
		opts  *core.EnqueueOpts
		field string
	}{
		{"max attempts wraps int32", echoArgs{}, &core.EnqueueOpts{MaxAttempts: 1<<32 + 5}, "max attempts"},
		{"max attempts above int32", echoArgs{}, &core.EnqueueOpts{MaxAttempts: math.MaxInt32 + 1}, "max attempts"},
		{"negative max attempts", echoArgs{}, &core.EnqueueOpts{MaxAttempts: -1}, "max attempts"},
		{"priority above smallint", echoArgs{}, &core.EnqueueOpts{Priority: new(1 << 16)}, "priority"},
		{"negative priority", echoArgs{}, &core.EnqueueOpts{Priority: new(-1)}, "priority"},
		{"run at year 300000", echoArgs{}, &core.EnqueueOpts{RunAt: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}, "run at"},
		{"run at year -5000", echoArgs{}, &core.EnqueueOpts{RunAt: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}, "run at"},
		{"NUL in kind", kindArgs{"a\x00b"}, nil, "kind"},
		{"NUL in queue", echoArgs{}, &core.EnqueueOpts{Queue: "q\x00"}, "queue"},
		{"NUL in ordering key", echoArgs{}, &core.EnqueueOpts{OrderingKey: "k\x00"}, "ordering key"},
		{"NUL in unique key", echoArgs{}, &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "u\x00"}}, "unique key"},
		{"NUL in args", echoArgs{Msg: "x\x00y"}, nil, "args"},
		{"NUL in metadata", echoArgs{}, &core.EnqueueOpts{Metadata: map[string]any{"k": "\x00"}}, "metadata"},
		{"empty tag", echoArgs{}, &core.EnqueueOpts{Tags: []string{""}}, "tags"},
		{"NUL in tag", echoArgs{}, &core.EnqueueOpts{Tags: []string{"a\x00"}}, "tags"},
		{"long tag", echoArgs{}, &core.EnqueueOpts{Tags: []string{strings.Repeat("t", 256)}}, "tags"},
	}
	for _, tc := range cases {
		for _, n := range []int{1, 10, 300} { // single, JSON batch, COPY batch
			params := make([]core.EnqueueParams, n)
			for i := range params {
				params[i] = core.EnqueueParams{Args: echoArgs{}, Opts: &core.EnqueueOpts{}}
			}
			params[n-1] = core.EnqueueParams{Args: tc.args, Opts: tc.opts}
			_, err := core.EnqueueMany(ctx, pool, params)
			var ve *core.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Errorf("%s (batch of %d): err = %v, want a *ValidationError on %q", tc.name, n, err, tc.field)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Fatalf("%d jobs written by refused enqueues", n)
	}
	// The largest values are accepted and stored as given, in batches too.
	params := make([]core.EnqueueParams, 300)
	for i := range params {
		params[i] = core.EnqueueParams{Args: echoArgs{}, Opts: &core.EnqueueOpts{MaxAttempts: math.MaxInt32, Priority: new(core.MaxPriority)}}
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE max_attempts = $1 AND priority = $2`, math.MaxInt32, core.MaxPriority); n != 300 {
		t.Fatalf("%d of 300 stored with the largest values", n)
	}
}

// NewClient refuses negative settings (which used to panic a library
// goroutine or fail every statement); nil handles of any kind give one
// clear error; AddWorker refuses a kind Enqueue would refuse.
func TestConfigAndHandleValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(context.Context, *core.Job[echoArgs]) error { return nil }))
	for _, cfg := range []core.Config{
		{PollInterval: -time.Second},
		{HeartbeatInterval: -time.Second},
		{LeaseDuration: -time.Second},
		{FetchLimit: -1},
		{Retention: core.Retention{BatchSize: -1}},
		{Queues: map[string]core.QueueConfig{"q\x00": {}}},
	} {
		cfg.Workers = ws
		if _, err := core.NewClient(pool, &cfg); err == nil {
			t.Errorf("NewClient accepted %+v", cfg)
		}
	}
	var nilPool *pgxpool.Pool
	if _, err := core.NewClient(nilPool, nil); err == nil {
		t.Error("NewClient accepted a nil pool")
	}
	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	for _, db := range []core.DB{nil, nilPool, (*sql.DB)(nil)} {
		_, err := core.Enqueue(ctx, db, echoArgs{}, nil)
		if !errors.Is(err, core.ErrUnsupportedDB) {
			t.Fatalf("Enqueue on %T: %v", db, err)
		}
		if strings.Count(err.Error(), "unsupported database handle") != 1 {
			t.Fatalf("repeats itself: %q", err)
		}
	}
	if err := core.AddWorker(core.NewWorkers(), core.WorkFunc[kindNul](func(context.Context, *core.Job[kindNul]) error { return nil })); err == nil {
		t.Fatal("AddWorker accepted a kind with a NUL byte")
	}
	if err := core.AddWorker(core.NewWorkers(), core.WorkFunc[kindLong](func(context.Context, *core.Job[kindLong]) error { return nil })); err == nil {
		t.Fatal("AddWorker accepted a 256-byte kind")
	}
}

type kindNul struct{}

func (kindNul) Kind() string { return "k\x00" }

type kindLong struct{}

func (kindLong) Kind() string { return strings.Repeat("k", 256) }

// The row rules refuse infinite timestamps on insert and on update.
func TestRowRulesRefuseInfiniteTimestamps(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, col := range []string{"run_at", "created_at"} {
		for _, v := range []string{"infinity", "-infinity"} {
			_, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, `+col+`) VALUES ('x', '`+v+`')`)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(pgErr.Message, "finite") {
				t.Fatalf("insert %s = %s: %v", col, v, err)
			}
		}
	}
	res, err := core.Enqueue(ctx, pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"run_at", "created_at", "attempted_at"} {
		_, err := pool.Exec(ctx, `UPDATE relay_jobs SET `+col+` = '-infinity' WHERE id = $1`, res.ID)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("update %s: %v", col, err)
		}
	}
}

// A row written behind the API that the client cannot run (infinite
// timestamps, JSON null args, an attempt beyond max_attempts) fails alone
// with its real error; the 20 normal jobs claimed with it run once each,
// and JobGet reads every row.
func TestUndecodableRowFailsAlone(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var runs atomic.Int32
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		runs.Add(1)
		return nil
	}))
	params := make([]core.EnqueueParams, 20)
	for i := range params {
		params[i] = core.EnqueueParams{Args: echoArgs{Msg: "ok"}}
	}
	good, err := core.EnqueueMany(ctx, pool, params)
	if err != nil {
		t.Fatal(err)
	}
	// Behind the API, with the row rules' triggers off (as a row written
	// before they existed, or by a tool that disabled them).
	bad := map[string]int64{}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE relay_jobs DISABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{
		"run_at -infinity":    `INSERT INTO relay_jobs (kind, run_at, max_attempts) VALUES ('echo', '-infinity', 3) RETURNING id`,
		"created_at infinity": `INSERT INTO relay_jobs (kind, created_at, max_attempts) VALUES ('echo', 'infinity', 3) RETURNING id`,
		"null args":           `INSERT INTO relay_jobs (kind, args, max_attempts) VALUES ('echo', 'null', 1) RETURNING id`,
		"attempt beyond max":  `INSERT INTO relay_jobs (kind, attempt, max_attempts) VALUES ('echo', 5, 3) RETURNING id`,
	} {
		var id int64
		if err := tx.QueryRow(ctx, sql).Scan(&id); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		bad[name] = id
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE relay_jobs ENABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Hour, FetchLimit: 100})
	for _, r := range good {
		if j := waitState(t, pool, r.ID, core.StateSucceeded); j.Attempt != 1 {
			t.Fatalf("normal job %d took %d attempts", r.ID, j.Attempt)
		}
	}
	wants := map[string]string{
		"run_at -infinity":    "run_at is -infinity",
		"created_at infinity": "created_at is infinity",
		"null args":           "null",
		"attempt beyond max":  "attempt 6 is beyond max_attempts 3",
	}
	for name, id := range bad {
		j := waitState(t, pool, id, core.StateDead)
		if !strings.Contains(j.LastError, wants[name]) || len(j.History) == 0 || !strings.Contains(j.History[len(j.History)-1].Error, wants[name]) {
			t.Fatalf("%s: last_error %q, history %+v; want it to name %q", name, j.LastError, j.History, wants[name])
		}
	}
	if n := runs.Load(); n != 20 {
		t.Fatalf("handler ran %d times; want 20 (the normal jobs only)", n)
	}
	if s := jobState(t, pool, bad["created_at infinity"]); s != core.StateDead {
		t.Fatalf("JobGet on the infinite row: %s", s)
	}
}
