package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pending lists the embedded migrations not yet applied to the database
// behind pool, by name (all of them on a database never migrated). A
// process that needs the current schema — a readiness check — calls it;
// only Migrate changes anything.
func Pending(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list embedded files: %w", err)
	}
	applied := map[string]bool{}
	rows, err := pool.Query(ctx, "SELECT name FROM "+table)
	if err == nil {
		for rows.Next() {
			var n string
			if err = rows.Scan(&n); err != nil {
				break
			}
			applied[n] = true
		}
		rows.Close()
		err = rows.Err()
	}
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // undefined_table: never migrated
		return nil, fmt.Errorf("migrations: read applied: %w", err)
	}
	var pending []string
	for _, n := range names {
		// bun/migrate names a migration by the file name's prefix before the
		// first underscore.
		id, _, _ := strings.Cut(n, "_")
		if !applied[id] {
			pending = append(pending, strings.TrimSuffix(strings.TrimSuffix(n, ".up.sql"), ".tx"))
		}
	}
	sort.Strings(pending)
	return pending, nil
}
