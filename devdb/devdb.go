// Package devdb gives examples and local experiments a migrated Relay
// database: a schema of their own on the PostgreSQL server at a URL, or a
// throwaway local cluster (PostgreSQL's initdb and pg_ctl on the PATH or in
// the usual install directories) removed at Close.
//
// It is for examples, demos and trying things out, not for production:
// there, apply migrations with `relay migrate` or migrations.Migrate and
// open your own pool.
package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
)

// Options say where the database is. The zero value starts a throwaway
// cluster and uses its public schema.
type Options struct {
	// URL is the server to use (pass os.Getenv("DATABASE_URL")); empty
	// starts a throwaway local cluster.
	URL string
	// Schema, when set, holds Relay's tables and the caller's: Open drops it
	// if a previous run left it (saying so on Out) and creates it afresh,
	// so a run never finds another's jobs; Close leaves it for inspection.
	// Lower-case letters, digits and underscores.
	Schema string
	// Out receives what Open did (cluster started, schema reset). Default:
	// nowhere.
	Out io.Writer
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// DB is an open, migrated database.
type DB struct {
	// Pool's connections use Schema, when one was given.
	Pool *pgxpool.Pool
	// URL connects to the same database and schema (for child processes).
	URL     string
	closers []func()
}

// Close closes the pool and stops the throwaway cluster, if one was
// started.
func (db *DB) Close() {
	for i := len(db.closers) - 1; i >= 0; i-- {
		db.closers[i]()
	}
	db.closers = nil
}

// Open returns a migrated database as o says.
func Open(ctx context.Context, o Options) (_ *DB, err error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	if o.Schema != "" && !schemaName.MatchString(o.Schema) {
		return nil, fmt.Errorf("devdb: schema %q: use lower-case letters, digits and underscores", o.Schema)
	}
	// Not the named result: the error returns below set that to nil, and
	// what was opened so far (a pool, a throwaway cluster) must still close.
	db := &DB{}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	u := o.URL
	if u == "" {
		fmt.Fprintln(out, "no DATABASE_URL; starting a throwaway PostgreSQL (removed at the end)")
		cluster, err := devpg.Start(ctx, devpg.Options{})
		if err != nil {
			return nil, fmt.Errorf("devdb: %w", err)
		}
		db.closers = append(db.closers, func() { cluster.Stop() }) //nolint:errcheck
		u = cluster.URL
	}
	if o.Schema != "" {
		if u, err = resetSchema(ctx, u, o.Schema, out); err != nil {
			return nil, err
		}
	}
	db.URL = u
	if db.Pool, err = pgxpool.New(ctx, u); err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	db.closers = append(db.closers, db.Pool.Close)
	if _, err := migrations.Migrate(ctx, db.Pool); err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	return db, nil
}

// resetSchema drops schema if it exists, creates it, and returns a URL
// whose connections use it.
func resetSchema(ctx context.Context, dbURL, schema string, out io.Writer) (string, error) {
	// The connection string comes first: one that cannot name the schema
	// fails before anything is dropped.
	withSchema, err := withSearchPath(dbURL, schema)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("devdb: connect: %w", err)
	}
	defer conn.Close(ctx)
	var existed bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&existed); err != nil {
		return "", fmt.Errorf("devdb: look for schema %s: %w", schema, err)
	}
	ident := pgx.Identifier{schema}.Sanitize()
	if existed {
		fmt.Fprintf(out, "schema %s is left from a previous run; dropping it so this run starts from nothing\n", schema)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			return "", fmt.Errorf("devdb: drop schema %s: %w", schema, err)
		}
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return "", fmt.Errorf("devdb: create schema %s: %w", schema, err)
	}
	return withSchema, nil
}

// withSearchPath returns the connection string with search_path set to
// schema: a postgres:// URL gets a query parameter, a key=value string
// ("host=... dbname=...") another pair.
func withSearchPath(conn, schema string) (string, error) {
	if !strings.Contains(conn, "://") {
		if _, err := pgx.ParseConfig(conn); err != nil {
			return "", fmt.Errorf("devdb: connection string: %w", err)
		}
		return conn + " search_path=" + schema, nil // schema is an identifier: no quoting needed
	}
	pu, err := url.Parse(conn)
	if err != nil {
		return "", errors.Join(errors.New("devdb: the database URL does not parse"), err)
	}
	q := pu.Query()
	q.Set("search_path", schema)
	pu.RawQuery = q.Encode()
	return pu.String(), nil
}
