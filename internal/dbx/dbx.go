// Package dbx runs SQL on whichever database handle a caller gives Relay:
// pgx, bun or database/sql, transaction, connection or pool. core and the
// packages above it share it, so every call that joins a caller's
// transaction accepts the same handles.
package dbx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/uptrace/bun"
)

// Execer is the two calls Relay needs from a database handle.
type Execer interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// Query runs a statement and calls scan once per row.
	Query(ctx context.Context, sql string, args []any, scan func(row Scanner) error) error
}

// Scanner is one result row.
type Scanner interface{ Scan(dest ...any) error }

// ErrUnsupported is returned by For for a handle it does not know.
var ErrUnsupported = errors.New("unsupported database handle")

// pgxQuerier is satisfied by pgx.Tx, *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sqlQuerier is satisfied by *sql.Tx, *sql.DB, *sql.Conn.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// For returns an Execer for db, which may be a pgx.Tx, *pgx.Conn,
// *pgxpool.Pool, *pgxpool.Conn, bun.Tx, *bun.Tx, *bun.DB, bun.Conn, *sql.Tx,
// *sql.DB or *sql.Conn (any PostgreSQL driver: parameters are passed as
// strings and integers only), or an Execer.
func For(db any) (Execer, error) {
	switch v := db.(type) {
	case nil:
		return nil, fmt.Errorf("%w: nil", ErrUnsupported)
	case Execer:
		return v, nil
	// bun's handles format queries with bun's own placeholders; Relay's SQL
	// uses $n, so go to the database/sql handle beneath.
	case bun.Tx:
		return SQL{v.Tx}, nil
	case *bun.Tx:
		return SQL{v.Tx}, nil
	case *bun.DB:
		return SQL{v.DB}, nil
	case bun.Conn:
		return SQL{v.Conn}, nil
	case pgxQuerier:
		return PGX{v}, nil
	case sqlQuerier:
		return SQL{v}, nil
	}
	return nil, fmt.Errorf("%w: %T (want a pgx, bun or database/sql transaction, connection or pool)", ErrUnsupported, db)
}

// InTransaction reports whether db is a caller's transaction (pgx.Tx,
// bun.Tx, *bun.Tx, *sql.Tx), whose commit is the caller's: what Relay
// writes through it becomes visible then, and a NOTIFY must ride on that
// commit. Any other handle runs each statement as its own transaction.
func InTransaction(db any) bool {
	switch db.(type) {
	case pgx.Tx, bun.Tx, *bun.Tx, *sql.Tx:
		return true
	}
	return false
}

// PGX runs SQL on a pgx handle.
type PGX struct{ Q pgxQuerier }

func (e PGX) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.Q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (e PGX) Query(ctx context.Context, sql string, args []any, scan func(Scanner) error) error {
	rows, err := e.Q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// SQL runs SQL on a database/sql handle.
type SQL struct{ Q sqlQuerier }

func (e SQL) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.Q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e SQL) Query(ctx context.Context, query string, args []any, scan func(Scanner) error) error {
	rows, err := e.Q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
