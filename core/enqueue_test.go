package core_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// Each transaction type joins the caller's transaction: a rollback leaves
// nothing, a commit leaves the job.
func TestEnqueueJoinsCallerTransaction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	bundb := bun.NewDB(sqldb, pgdialect.New())

	type txCase struct {
		name  string
		begin func() (db core.DB, commit, rollback func() error)
	}
	cases := []txCase{
		{"pgx.Tx", func() (core.DB, func() error, func() error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		}},
		{"bun.Tx", func() (core.DB, func() error, func() error) {
			tx, err := bundb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}},
		{"*sql.Tx", func() (core.DB, func() error, func() error) {
			tx, err := sqldb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}},
	}
	for _, tc := range cases {
		queue := "q_" + tc.name[:3]
		opts := &core.EnqueueOpts{Queue: queue}
		db, _, rollback := tc.begin()
		if _, err := core.Enqueue(ctx, db, echoArgs{Msg: "one"}, opts); err != nil {
			t.Fatalf("%s: enqueue: %v", tc.name, err)
		}
		if _, err := core.EnqueueMany(ctx, db, []core.EnqueueParams{{Args: echoArgs{}, Opts: opts}, {Args: echoArgs{}, Opts: opts}}); err != nil {
			t.Fatalf("%s: enqueue many: %v", tc.name, err)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE queue = $1", queue); n != 0 {
			t.Fatalf("%s: rollback left %d jobs", tc.name, n)
		}

		db, commit, _ := tc.begin()
		if _, err := core.Enqueue(ctx, db, echoArgs{Msg: "one"}, opts); err != nil {
			t.Fatalf("%s: enqueue: %v", tc.name, err)
		}
		if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE queue = $1", queue); n != 0 {
			t.Fatalf("%s: job visible before commit", tc.name)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE queue = $1", queue); n != 1 {
			t.Fatalf("%s: commit left %d jobs, want 1", tc.name, n)
		}
	}

	// Pools and plain handles run the enqueue as its own statement.
	for name, db := range map[string]core.DB{"pgxpool": pool, "sql.DB": sqldb, "bun.DB": bundb} {
		if _, err := core.Enqueue(ctx, db, echoArgs{}, &core.EnqueueOpts{Queue: "pools"}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE queue = 'pools'"); n != 3 {
		t.Fatalf("pool enqueues wrote %d jobs, want 3", n)
	}
	if _, err := core.Enqueue(ctx, "not a db", echoArgs{}, nil); !errors.Is(err, core.ErrUnsupportedDB) {
		t.Fatalf("enqueue into a string: %v", err)
	}
}

func TestEnqueueOptionsStored(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	runAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	res, err := core.Enqueue(ctx, pool, echoArgs{Msg: "x"}, &core.EnqueueOpts{
		Queue: "emails", Priority: new(3), RunAt: runAt, MaxAttempts: 7, Metadata: map[string]any{"tenant": "acme"},
	})
	if err != nil {
		t.Fatal(err)
	}
	j, err := core.JobGet(ctx, pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Queue != "emails" || j.Priority != 3 || !j.RunAt.Equal(runAt) || j.MaxAttempts != 7 || j.State != core.StateQueued || j.Kind != "echo" {
		t.Fatalf("stored job: %+v", j)
	}
	if string(j.Metadata) != `{"tenant": "acme"}` || string(j.EncodedArgs) != `{"msg": "x"}` {
		t.Fatalf("metadata %s args %s", j.Metadata, j.EncodedArgs)
	}

	// Defaults, and a delay counted from the database's clock.
	res, err = core.Enqueue(ctx, pool, echoArgs{}, &core.EnqueueOpts{Delay: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var queue string
	var prio, maxAttempts int
	var delay time.Duration
	if err := pool.QueryRow(ctx, `SELECT queue, priority, max_attempts, run_at - created_at FROM relay_jobs WHERE id = $1`, res.ID).
		Scan(&queue, &prio, &maxAttempts, &delay); err != nil {
		t.Fatal(err)
	}
	if queue != core.DefaultQueue || prio != 0 || maxAttempts != core.DefaultMaxAttempts || delay != 90*time.Second {
		t.Fatalf("defaults: queue=%s prio=%d max=%d delay=%s", queue, prio, maxAttempts, delay)
	}
}

type withDefaults struct{}

func (withDefaults) Kind() string { return "with_defaults" }
func (withDefaults) EnqueueOpts() core.EnqueueOpts {
	return core.EnqueueOpts{Queue: "reports", Priority: new(5), MaxAttempts: 2}
}

func TestEnqueueKindDefaultsAndOverrides(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	a, _ := core.Enqueue(ctx, pool, withDefaults{}, nil)
	b, _ := core.Enqueue(ctx, pool, withDefaults{}, &core.EnqueueOpts{Priority: new(1)})
	ja, _ := core.JobGet(ctx, pool, a.ID)
	jb, _ := core.JobGet(ctx, pool, b.ID)
	if ja.Queue != "reports" || ja.Priority != 5 || ja.MaxAttempts != 2 {
		t.Fatalf("kind defaults not applied: %+v", ja)
	}
	if jb.Queue != "reports" || jb.Priority != 1 || jb.MaxAttempts != 2 {
		t.Fatalf("override not applied field by field: %+v", jb)
	}
}

type emptyKind struct{}

func (emptyKind) Kind() string { return "" }

type unencodable struct {
	C chan int `json:"c"`
}

func (unencodable) Kind() string { return "unencodable" }

// Bad input is refused with a clear error before anything is written, and a
// bad job in a batch writes none of the batch.
func TestEnqueueRejectsBadInput(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		args  core.JobArgs
		opts  *core.EnqueueOpts
		field string
	}{
		{"empty kind", emptyKind{}, nil, "kind"},
		{"unencodable args", unencodable{C: make(chan int)}, nil, "args"},
		{"nil args", nil, nil, "args"},
		{"negative priority", echoArgs{}, &core.EnqueueOpts{Priority: new(-1)}, "priority"},
		{"priority too large", echoArgs{}, &core.EnqueueOpts{Priority: new(core.MaxPriority + 1)}, "priority"},
		{"negative delay", echoArgs{}, &core.EnqueueOpts{Delay: -time.Second}, "delay"},
		{"run at and delay", echoArgs{}, &core.EnqueueOpts{Delay: time.Second, RunAt: time.Now()}, "run at"},
		{"negative attempts", echoArgs{}, &core.EnqueueOpts{MaxAttempts: -1}, "max attempts"},
		{"unencodable metadata", echoArgs{}, &core.EnqueueOpts{Metadata: map[string]any{"f": func() {}}}, "metadata"},
	}
	for _, tc := range cases {
		_, err := core.Enqueue(ctx, pool, tc.args, tc.opts)
		var ve *core.ValidationError
		if !errors.As(err, &ve) || ve.Field != tc.field {
			t.Errorf("%s: got %v, want a ValidationError on %q", tc.name, err, tc.field)
		}
	}
	_, err := core.EnqueueMany(ctx, pool, []core.EnqueueParams{{Args: echoArgs{}}, {Args: emptyKind{}}})
	if err == nil {
		t.Fatal("batch with a bad job: no error")
	}
	if n := count(t, pool, "SELECT count(*) FROM relay_jobs"); n != 0 {
		t.Fatalf("bad input wrote %d jobs", n)
	}
}

// A batch is one statement: ids come back in the order given.
func TestEnqueueManyBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	params := make([]core.EnqueueParams, 5000)
	for i := range params {
		params[i] = core.EnqueueParams{Args: echoArgs{Msg: string(rune('a' + i%26))}, Opts: &core.EnqueueOpts{Priority: new(i % 4)}}
	}
	res, err := core.EnqueueMany(ctx, pool, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(params) {
		t.Fatalf("got %d results", len(res))
	}
	for i := range res {
		if i > 0 && res[i].ID <= res[i-1].ID {
			t.Fatalf("ids out of order at %d", i)
		}
	}
	// Spot-check that each id holds the job given at its position.
	for _, i := range []int{0, 1, 2500, 4999} {
		var prio int
		if err := pool.QueryRow(ctx, "SELECT priority FROM relay_jobs WHERE id = $1", res[i].ID).Scan(&prio); err != nil {
			t.Fatal(err)
		}
		if prio != i%4 {
			t.Fatalf("job %d: priority %d, want %d", i, prio, i%4)
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
