package core_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

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
