package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
)

// schemaCheckTimeout bounds Start's question about the schema, for a
// server that accepts connections and then does not answer.
const schemaCheckTimeout = 30 * time.Second

// checkSchema fails when the database behind pool has migrations pending or
// cannot be reached, so that a client never starts loops that would only
// log the same missing-relation error for ever.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
	defer cancel()
	err := migrations.Check(ctx, pool)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		// A prepared statement of pgx's cache met another's on the same
		// server connection (duplicate_prepared_statement) or was missing
		// from it (invalid_sql_statement_name): a transaction-pooling
		// proxy, before Start's own probe could say so.
		return fmt.Errorf("%w (%v)", ErrStatementCache, err)
	}
	if err != nil && !errors.Is(err, migrations.ErrNotMigrated) {
		return fmt.Errorf("ask the database for its schema version: %w", err)
	}
	return err
}
