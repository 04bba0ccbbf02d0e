package admin

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
)

// Start's grants check asks for EXECUTE on Relay's functions only, those
// owned by relay_jobs' owner: a function of the application's own with the
// relay_ prefix in the same schema (likely when Relay lives in public),
// made by another role, which the worker role may not execute and Relay
// never calls, does not make a worker client refuse to start (a hostile
// review found it did).
func TestGrantsCheckIgnoresOthersRelayPrefixedFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoleDB(t)
	for _, stmt := range []string{
		`CREATE FUNCTION relay.relay_revenue_report() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`REVOKE EXECUTE ON FUNCTION relay.relay_revenue_report() FROM PUBLIC`,
		`REVOKE EXECUTE ON FUNCTION relay.relay_revenue_report() FROM ` + r.app,
	} {
		if _, err := r.super.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	pool, err := pgxpool.New(ctx, r.appURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[roleJob](func(ctx context.Context, j *core.Job[roleJob]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start refused over a function that is not Relay's: %v", err)
	}
	stopBounded(t, c.Stop)
}

// EXECUTE held through a granted (inheriting) role satisfies the check, as
// it satisfies the statements.
func TestGrantsCheckAcceptsExecuteViaRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoleDB(t)
	group := r.app + "_grp"
	t.Cleanup(func() { r.super.Exec(context.Background(), "DROP OWNED BY "+group+"; DROP ROLE IF EXISTS "+group) }) //nolint:errcheck
	for _, stmt := range []string{
		"CREATE ROLE " + group + " NOLOGIN",
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA relay TO " + group,
		"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA relay FROM " + r.app,
		"GRANT " + group + " TO " + r.app,
	} {
		if _, err := r.super.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	pool, err := pgxpool.New(ctx, r.appURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[roleJob](func(ctx context.Context, j *core.Job[roleJob]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start with EXECUTE through a granted role: %v", err)
	}
	stopBounded(t, c.Stop)
}
