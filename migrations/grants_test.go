package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// hardenedInstall is a database whose Relay schema (relay) is owned by a
// role whose default privileges revoke EXECUTE on new functions from
// PUBLIC, as PostgreSQL's docs suggest for a hardened install, and an
// application role granted what it needs on the objects there at install
// time, EXECUTE on the functions included.
type hardenedInstall struct {
	owner, app *pgxpool.Pool
	appRole    string
}

// newHardenedInstall migrates through the migrations before stopped (all
// of them when stopped is ""), then grants the application role.
func newHardenedInstall(t *testing.T, stopped string) *hardenedInstall {
	t.Helper()
	ctx := context.Background()
	owner := fmt.Sprintf("hard_owner_%d", time.Now().UnixNano()%1e12)
	app := strings.Replace(owner, "owner", "app", 1)
	var u string
	// Registered before the database is made, so it runs after the
	// database is dropped (cleanups run last first).
	t.Cleanup(func() {
		if u == "" {
			return
		}
		p, _ := url.Parse(u)
		p.Path = "/postgres"
		c, err := pgxpool.New(context.Background(), p.String())
		if err != nil {
			t.Errorf("drop roles: %v", err)
			return
		}
		defer c.Close()
		for _, r := range []string{app, owner} {
			if _, err := c.Exec(context.Background(), `DROP ROLE IF EXISTS `+r); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})
	u = testdb.EmptyURL(t)
	super, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(super.Close)
	var db string
	if err := super.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`CREATE ROLE ` + owner + ` LOGIN`, `CREATE ROLE ` + app + ` LOGIN`,
		`GRANT CREATE ON DATABASE ` + db + ` TO ` + owner,
		`ALTER DEFAULT PRIVILEGES FOR ROLE ` + owner + ` REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC`,
	} {
		if _, err := super.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	as := func(role string) *pgxpool.Pool {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		p.User = url.User(role)
		q := p.Query()
		q.Set("search_path", "relay")
		p.RawQuery = q.Encode()
		pool, err := pgxpool.New(ctx, p.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	h := &hardenedInstall{owner: as(owner), appRole: app}
	if _, err := h.owner.Exec(ctx, `CREATE SCHEMA relay`); err != nil {
		t.Fatal(err)
	}
	if stopped == "" {
		if _, err := migrations.Migrate(ctx, h.owner); err != nil {
			t.Fatal(err)
		}
	} else {
		ownDB := stdlib.OpenDBFromPool(h.owner)
		defer ownDB.Close()
		if _, err := migrations.MigrateFS(ctx, ownDB, filesBefore(t, stopped)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.owner.Exec(ctx, `
		GRANT USAGE ON SCHEMA relay TO `+app+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA relay TO `+app+`;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA relay TO `+app+`;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA relay TO `+app); err != nil {
		t.Fatal(err)
	}
	h.app = as(app)
	return h
}

// An install hardened before *_after_triggers_small_when upgrades through
// it and keeps claiming: every update of a job's state calls
// relay_jobs_key_moved from the key triggers' WHEN clause, which
// PostgreSQL checks EXECUTE on for keyed and unkeyed rows alike, and the
// function, new since the install's grants, is granted to PUBLIC
// (*_trigger_clause_functions_execute). Without that grant the claim
// after the upgrade fails: permission denied for function
// relay_jobs_key_moved.
func TestHardenedInstallUpgradeKeepsClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHardenedInstall(t, "20261210010001_after_triggers_small_when.tx.up.sql")
	claim := func(id int) error {
		if _, err := h.app.Exec(ctx, `INSERT INTO relay_jobs (id, kind, queue) VALUES ($1, 'k', 'q')`, id); err != nil {
			return err
		}
		_, err := h.app.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(),
			lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, id)
		return err
	}
	if err := claim(1); err != nil {
		t.Fatalf("before the upgrade: %v", err)
	}
	if _, err := migrations.Migrate(ctx, h.owner); err != nil {
		t.Fatal(err)
	}
	if err := claim(2); err != nil {
		t.Errorf("an unkeyed claim after the upgrade: %v", err)
	}
}

// Every function that a trigger's WHEN clause on a Relay table calls is
// executable by every role, on an install whose owner revoked EXECUTE on
// new functions from PUBLIC: PostgreSQL checks EXECUTE on such a function
// for every row a statement updates, so a role that writes the table
// without it fails every write, while a trigger's own function needs no
// EXECUTE to fire. A migration adding such a function grants it to PUBLIC
// (it must be a pure function of its arguments, as relay_jobs_key_moved is).
func TestTriggerClauseFunctionsExecutableByAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHardenedInstall(t, "")
	rows, err := h.owner.Query(ctx, `
		SELECT DISTINCT t.tgrelid::regclass::text, t.tgname, d.refobjid::regprocedure::text,
		       has_function_privilege('public', d.refobjid, 'EXECUTE')
		FROM pg_trigger AS t
		JOIN pg_depend AS d ON d.classid = 'pg_trigger'::regclass AND d.objid = t.oid
		                   AND d.refclassid = 'pg_proc'::regclass AND d.refobjid <> t.tgfoid
		WHERE NOT t.tgisinternal AND t.tgrelid::regclass::text LIKE 'relay\_%'
		ORDER BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var table, trigger, fn string
		var ok bool
		if err := rows.Scan(&table, &trigger, &fn, &ok); err != nil {
			t.Fatal(err)
		}
		seen++
		if !ok {
			t.Errorf("trigger %s on %s calls %s in its WHEN clause, which PUBLIC may not execute: grant it in the migration", trigger, table, fn)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// relay_jobs_key_update and relay_jobs_key_update_note call
	// relay_jobs_key_moved: the query must see them.
	if seen < 2 {
		t.Errorf("%d trigger clause functions found, want at least relay_jobs_key_moved's two triggers", seen)
	}
}
