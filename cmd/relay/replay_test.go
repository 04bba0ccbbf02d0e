package main

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// Histories recorded by `relay prove workflow`, exported with `relay runs
// history` through relay serve, replay on the proof's own code; with the
// email and report children started in the other order they fail, naming
// the run, the position and both keys; with that change behind a Patch
// they replay again.
func TestReplayProofHistories(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	dbURL := testdb.URL(t)
	f := runProof(t, bin, "workflow", "--database-url", dbURL, "--runs", "6", "--processes", "1", "--concurrency", "2",
		"--sleep", "50ms", "--keep")
	if f["completed"] == "0" {
		t.Fatalf("the proof completed no run: %v", f)
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var schema string
	if err := admin.QueryRow(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'relay_prove_%'`).Scan(&schema); err != nil {
		t.Fatalf("the proof's kept schema: %v", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT id FROM relay_workflow_runs WHERE workflow = 'prove.payment' AND state IN ('completed', 'compensated') ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) == 0 {
		t.Fatalf("finished payment runs: %v %v", ids, err)
	}

	addr := startServe(t, bin, u.String(), nil, "--no-auth")
	e := &opEnv{t: t, bin: bin, addr: addr, env: []string{"RELAY_URL=http://" + addr}}
	var exported bytes.Buffer
	for _, id := range ids {
		exported.WriteString(e.ok("runs", "history", id))
	}
	e.fails(`relay runs history: 404 Not Found: workflow run "nope" not found`, "runs", "history", "nope")
	hs, err := workflow.DecodeHistories(&exported)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != len(ids) {
		t.Fatalf("%d histories decoded of %d runs", len(hs), len(ids))
	}

	real := workflow.NewRegistry(pool, nil)
	registerProveWorkflows(real, &proveEnv{pool: pool, worker: "replay"})
	if err := workflow.Replay(ctx, real, hs...); err != nil {
		t.Fatalf("the proof's histories on its own code: %v", err)
	}

	reordered := workflow.NewRegistry(nil, nil)
	workflow.MustRegister(reordered, "prove.payment", provePaymentVariant(false))
	err = workflow.Replay(ctx, reordered, hs...)
	var re *workflow.ReplayError
	var nd *workflow.NonDeterminismError
	if !errors.As(err, &re) || !errors.As(err, &nd) {
		t.Fatalf("report before email: %v, want a non-determinism per run", err)
	}
	if nd.Position != 1 || nd.HistoryKey != "child:email" || nd.CodeKey != "child:report" || re.RunID != ids[0] {
		t.Fatalf("report before email: run %s position %d, history %q, code %q", re.RunID, nd.Position, nd.HistoryKey, nd.CodeKey)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != len(ids) {
		t.Fatalf("%d runs reported of %d: %v", n, len(ids), err)
	}

	patched := workflow.NewRegistry(nil, nil)
	workflow.MustRegister(patched, "prove.payment", provePaymentVariant(true))
	if err := workflow.Replay(ctx, patched, hs...); err != nil {
		t.Fatalf("the reorder behind a Patch: %v", err)
	}
}

// provePaymentVariant is the proof's payment path with its children
// started report first: plainly (patched false), or behind
// Patch("report-first"), the old order kept for runs that recorded it. Its
// functions never run: a replay answers every step from history.
func provePaymentVariant(patched bool) func(workflow.Context, payIn) (string, error) {
	side := func(wctx workflow.Context, in sideIn) (string, error) { return "", nil }
	reg := workflow.NewRegistry(nil, nil)
	email := workflow.MustRegister(reg, "prove.email", side)
	report := workflow.MustRegister(reg, "prove.report", side)
	return func(wctx workflow.Context, in payIn) (string, error) {
		if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) { return 0, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
		var e, r *workflow.ChildFuture[string]
		if patched && !workflow.Patch(wctx, "report-first") {
			e = workflow.Child(wctx, "email", email, sideIn{}, nil)
			r = workflow.Child(wctx, "report", report, sideIn{}, nil)
		} else {
			r = workflow.Child(wctx, "report", report, sideIn{}, nil)
			e = workflow.Child(wctx, "email", email, sideIn{}, nil)
		}
		// As the proof: the first child to end chosen by a Select, both
		// collected, the cool-off, the ask, the address update, and a Select of the approval
		// and a timer.
		if _, err := workflow.Select(wctx, "first-side", workflow.OnChild(e), workflow.OnChild(r)); err != nil {
			return "", err
		}
		if _, err := e.Get(wctx); err != nil {
			return "", err
		}
		if _, err := r.Get(wctx); err != nil {
			return "", err
		}
		if err := workflow.Sleep(wctx, "cool-off", time.Millisecond); err != nil {
			return "", err
		}
		if _, err := workflow.Step(wctx, "ask", func(ctx context.Context) (bool, error) { return true, nil }, nil); err != nil {
			return "", err
		}
		if in.Update {
			if _, err := workflow.HandleUpdate(wctx, proveUpdateName, func(wctx workflow.Context, addr string) (string, error) {
				_, err := workflow.StepTx(wctx, "apply-address", func(ctx context.Context, tx pgx.Tx) (bool, error) { return true, nil }, nil)
				return "applied " + addr, err
			}, &workflow.UpdateOpts[string]{Timeout: 5 * time.Minute}); err != nil {
				return "", err
			}
		}
		approve := workflow.OnSignal[string](proveSignalName)
		if _, err := workflow.Select(wctx, "approval", approve, workflow.OnTimer(5*time.Minute)); err != nil {
			return "", err
		}
		_, err := workflow.StepTx(wctx, "notify", func(ctx context.Context, tx pgx.Tx) (bool, error) { return true, nil }, nil)
		return approve.Payload(), err
	}
}
