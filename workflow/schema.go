package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/migrations"
)

// explainMissingSchema turns a start's "relation does not exist" into the
// error that says what to do: on a database whose migrations are pending,
// the returned error matches migrations.ErrNotMigrated and names the
// command that applies them (the server's error follows it). Any other
// error, and one the registry's pool cannot explain, is returned as it is.
func (r *Registry) explainMissingSchema(ctx context.Context, name string, err error) error {
	var pgErr *pgconn.PgError
	if err == nil || r.pool == nil || !errors.As(err, &pgErr) || pgErr.Code != "42P01" { // undefined_table
		return err
	}
	// On the registry's pool, not the caller's handle: a transaction is
	// aborted by the error.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if check := migrations.Check(ctx, r.pool); errors.Is(check, migrations.ErrNotMigrated) {
		return fmt.Errorf("workflow: start %s: %w (%w)", name, check, pgErr)
	}
	return err
}
