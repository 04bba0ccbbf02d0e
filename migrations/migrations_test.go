package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Processes migrating one empty database at once are serialized by the
// advisory lock: each migration is applied exactly once, and a second run
// finds nothing to do.
func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]migrations.Result, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			results[i], errs[i] = migrations.Migrate(ctx, pool)
		}()
	}
	wg.Wait()
	applied := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		applied += len(results[i].Applied)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var files, rows int
	pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT name) FROM relay_migrations`).Scan(&rows, &files)
	if rows != files || applied != files || files == 0 {
		t.Fatalf("applied %d times over %d bookkeeping rows for %d migrations", applied, rows, files)
	}
	var exists bool
	pool.QueryRow(ctx, `SELECT to_regclass('relay_jobs') IS NOT NULL`).Scan(&exists)
	if !exists {
		t.Fatal("relay_jobs missing")
	}
	again, err := migrations.Migrate(ctx, pool)
	if err != nil || len(again.Applied) != 0 {
		t.Fatalf("second run: %v %v", again, err)
	}
	// The indexes built concurrently (20261201000004, outside a
	// transaction) are there and valid, and the temporary name is gone.
	// (Migrators waiting in pg_advisory_lock would hold snapshots the
	// builds wait for: this test hung.)
	rows2, err := pool.Query(ctx, `
		SELECT c.relname, i.indisvalid, pg_get_indexdef(c.oid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'relay_jobs'::regclass AND c.relname LIKE 'relay_jobs_%heads%'
		   OR c.relname = 'relay_jobs_claim_idx'
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows2.Next() {
		var name, def string
		var valid bool
		if err := rows2.Scan(&name, &valid, &def); err != nil {
			t.Fatal(err)
		}
		if !valid {
			t.Fatalf("index %s is invalid", name)
		}
		got = append(got, name)
		if name == "relay_jobs_claim_idx" && !strings.Contains(def, "(queue, key_waiting, priority, run_at, id) WHERE (state = 'queued'") {
			t.Fatalf("claim index: %s", def)
		}
	}
	if err := rows2.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "relay_jobs_claim_idx,relay_jobs_key_heads_idx" {
		t.Fatalf("indexes %v, want the claim index and the key heads index only", got)
	}
}

// A migration whose statement fails is reported, is not marked applied,
// and stops the run (the later ones are not applied either); what it did
// in its transaction is rolled back. A file without .tx runs its parts
// outside a transaction (CREATE INDEX CONCURRENTLY works there), and a
// failing part is reported too.
func TestFailedMigrationIsNotApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func(t *testing.T, fsys fstest.MapFS) (*pgxpool.Pool, error) {
		t.Helper()
		pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		sqldb := stdlib.OpenDBFromPool(pool)
		defer sqldb.Close()
		_, err = migrations.MigrateFS(ctx, sqldb, fsys)
		return pool, err
	}
	applied := func(t *testing.T, pool *pgxpool.Pool) string {
		t.Helper()
		var names string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(name, ',' ORDER BY name), '') FROM relay_migrations`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	exists := func(t *testing.T, pool *pgxpool.Pool, rel string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, rel).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	t.Run("tx", func(t *testing.T) {
		t.Parallel()
		pool, err := run(t, fstest.MapFS{
			"20300101000001_ok.tx.up.sql":    {Data: []byte("CREATE TABLE zz_ok (id int);\n")},
			"20300101000002_bad.tx.up.sql":   {Data: []byte("CREATE TABLE zz_bad (id int);\nSELECT 1/0;\n")},
			"20300101000003_later.tx.up.sql": {Data: []byte("CREATE TABLE zz_later (id int);\n")},
		})
		if err == nil || !strings.Contains(err.Error(), "20300101000002_bad.tx.up.sql") || !strings.Contains(err.Error(), "division by zero") {
			t.Fatalf("migrating got %v, want the failure of 20300101000002_bad", err)
		}
		if got := applied(t, pool); got != "20300101000001" {
			t.Fatalf("marked applied: %q, want only 20300101000001", got)
		}
		if !exists(t, pool, "zz_ok") || exists(t, pool, "zz_bad") || exists(t, pool, "zz_later") {
			t.Fatal("want zz_ok only: the failed migration rolled back, the later one not run")
		}
	})
	t.Run("outside a transaction", func(t *testing.T) {
		t.Parallel()
		pool, err := run(t, fstest.MapFS{
			"20300101000001_concurrently.up.sql": {Data: []byte(
				"CREATE TABLE zz_t (id int);\n--bun:split\nCREATE INDEX CONCURRENTLY zz_t_idx ON zz_t (id);\n--bun:split\nSELECT 1/0;\n")},
		})
		if err == nil || !strings.Contains(err.Error(), "part 3") {
			t.Fatalf("migrating got %v, want the failure of part 3", err)
		}
		if got := applied(t, pool); got != "" {
			t.Fatalf("marked applied: %q, want none", got)
		}
		if !exists(t, pool, "zz_t_idx") {
			t.Fatal("the index built concurrently (part 2) is missing")
		}
	})
}

// A migration run outside a transaction that stopped after any of its parts
// (a build that timed out, a killed process) runs again from the start and
// finishes with the same schema as a run that never stopped: each part is
// written to run again, and no index is left invalid or missing. Every
// such file is stopped after each of its parts in turn.
func TestStoppedMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	names, err := fs.Glob(migrations.Files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	open := func(t *testing.T) (*pgxpool.Pool, *sql.DB) {
		t.Helper()
		pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		sqldb := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { sqldb.Close() })
		return pool, sqldb
	}
	// What a run that never stopped leaves: every index (valid or not) and
	// every function of the schema.
	schema := func(t *testing.T, pool *pgxpool.Pool) string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `
			SELECT coalesce((SELECT string_agg(c.relname || CASE WHEN i.indisvalid THEN '' ELSE ' INVALID' END || ': ' || pg_get_indexdef(c.oid), E'\n' ORDER BY c.relname)
			                 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			                 WHERE n.nspname = 'public'), '') || E'\n' ||
			       coalesce((SELECT string_agg(p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') ' || md5(p.prosrc), E'\n' ORDER BY p.proname, pg_get_function_identity_arguments(p.oid))
			                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'), '')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	refPool, refDB := open(t)
	if _, err := migrations.MigrateDB(ctx, refDB); err != nil {
		t.Fatal(err)
	}
	want := schema(t, refPool)

	for _, stopped := range names {
		if strings.HasSuffix(stopped, ".tx.up.sql") {
			continue
		}
		text, err := fs.ReadFile(migrations.Files, stopped)
		if err != nil {
			t.Fatal(err)
		}
		parts := migrations.SplitParts(string(text))
		before := filesBefore(t, stopped)
		for k := 1; k < len(parts); k++ {
			t.Run(fmt.Sprintf("%s after part %d", stopped, k), func(t *testing.T) {
				t.Parallel()
				pool, sqldb := open(t)
				if _, err := migrations.MigrateFS(ctx, sqldb, before); err != nil {
					t.Fatal(err)
				}
				for i, p := range parts[:k] {
					if _, err := pool.Exec(ctx, p); err != nil {
						t.Fatalf("part %d: %v", i+1, err)
					}
				}
				if _, err := migrations.MigrateDB(ctx, sqldb); err != nil {
					t.Fatalf("migrating again after part %d: %v", k, err)
				}
				if got := schema(t, pool); got != want {
					t.Fatalf("after part %d and a second run the schema differs from an uninterrupted run's:\n%s\nwant:\n%s", k, got, want)
				}
			})
		}
	}
}

// A DROP INDEX CONCURRENTLY that fails half-way (a lock wait that timed out)
// leaves the index behind, invalid. 20261201000004 stopped there, with its
// new claim index built under another name, finishes the swap when run
// again instead of dropping the valid new index and rebuilding it beside an
// invalid one: the same schema as an uninterrupted run, and a valid claim
// index at every step of the second run.
func TestKeyRefixMigrationFinishesAFailedSwap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const stopped = "20261201000004_key_refix.up.sql"
	text, err := fs.ReadFile(migrations.Files, stopped)
	if err != nil {
		t.Fatal(err)
	}
	parts := migrations.SplitParts(string(text))
	drop := -1
	for i, p := range parts {
		if strings.Contains(p, "DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_claim_idx;") {
			drop = i
		}
	}
	if drop < 0 {
		t.Fatalf("%s has no part dropping the old claim index", stopped)
	}
	before := filesBefore(t, stopped)
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var super bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Skip("marking an index invalid needs a superuser")
	}
	sqldb := stdlib.OpenDBFromPool(pool)
	defer sqldb.Close()
	if _, err := migrations.MigrateFS(ctx, sqldb, before); err != nil {
		t.Fatal(err)
	}
	for i, p := range parts[:drop] {
		if _, err := pool.Exec(ctx, p); err != nil {
			t.Fatalf("part %d: %v", i+1, err)
		}
	}
	// What the failed DROP INDEX CONCURRENTLY leaves: the old index, invalid.
	if _, err := pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'relay_jobs_claim_idx'::regclass`); err != nil {
		t.Fatal(err)
	}
	// While the second run goes on, a valid index of the claim's shape is
	// always there (checked between its statements by a watcher).
	done := make(chan struct{})
	gaps := make(chan string, 1)
	go func() {
		defer close(gaps)
		for {
			select {
			case <-done:
				return
			default:
			}
			var n int
			if err := pool.QueryRow(ctx, `
				SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
				WHERE i.indrelid = 'relay_jobs'::regclass AND i.indisvalid
				  AND pg_get_indexdef(c.oid) LIKE '%(queue, key_waiting, priority, run_at, id) WHERE (state = ''queued''%'`).Scan(&n); err == nil && n == 0 {
				gaps <- "no valid claim index"
				return
			}
		}
	}()
	_, err = migrations.MigrateDB(ctx, sqldb)
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	if gap, ok := <-gaps; ok {
		t.Fatalf("during the second run: %s", gap)
	}
	var valid, leftovers bool
	if err := pool.QueryRow(ctx, `
		SELECT coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('relay_jobs_claim_idx')), false),
		       to_regclass('relay_jobs_claim_idx_old') IS NOT NULL OR to_regclass('relay_jobs_claim_idx_heads') IS NOT NULL`).Scan(&valid, &leftovers); err != nil {
		t.Fatal(err)
	}
	if !valid || leftovers {
		t.Fatalf("claim index valid %v, leftovers %v", valid, leftovers)
	}
}

// filesBefore is the embedded migration files that run before file stopped.
func filesBefore(t *testing.T, stopped string) fstest.MapFS {
	t.Helper()
	names, err := fs.Glob(migrations.Files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	before := fstest.MapFS{}
	for _, n := range names {
		if n < stopped {
			b, err := fs.ReadFile(migrations.Files, n)
			if err != nil {
				t.Fatal(err)
			}
			before[n] = &fstest.MapFile{Data: b}
		}
	}
	return before
}
