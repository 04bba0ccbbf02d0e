package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/testdb"
	"github.com/relayq/relay/migrations"
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
}
