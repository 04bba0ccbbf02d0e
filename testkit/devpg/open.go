package devpg

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
)

// Open is the examples' database: a pool on url, or on a throwaway cluster
// when url is empty (saying so on out), migrated. close releases it all.
func Open(ctx context.Context, url string, out io.Writer) (pool *pgxpool.Pool, close func(), err error) {
	var closers []func()
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			close()
		}
	}()
	if url == "" {
		fmt.Fprintln(out, "no DATABASE_URL; starting a throwaway PostgreSQL")
		cluster, err := Start(ctx, Options{})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { cluster.Stop() }) //nolint:errcheck
		url = cluster.URL
	}
	if pool, err = pgxpool.New(ctx, url); err != nil {
		return nil, nil, err
	}
	closers = append(closers, pool.Close)
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		return nil, nil, err
	}
	return pool, close, nil
}
