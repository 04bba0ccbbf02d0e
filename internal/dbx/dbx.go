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
	"reflect"

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

// ErrUnsupported is returned by For for a handle it does not know (a nil
// one included). It is core.ErrUnsupportedDB: every package that takes a
// core.DB fails a wrong handle with the same error.
var ErrUnsupported = errors.New("core: unsupported database handle")

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
	// A typed nil (a *pgxpool.Pool or *sql.DB never opened) would panic on
	// first use.
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: a nil %T", ErrUnsupported, db)
	}
	switch v := db.(type) {
	case nil:
		return nil, fmt.Errorf("%w: nil (want a pgx, bun or database/sql transaction, connection or pool)", ErrUnsupported)
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

// InTx runs fn in db's transaction when db is one (the caller's: fn joins
// it, and the commit is the caller's), else in a transaction begun on db
// (a pool or connection), committed when fn returns nil and rolled back
// otherwise. fn is given the transaction's handle (an Execer is given to
// fn as it is). A handle For refuses fails with For's error.
func InTx(ctx context.Context, db any, fn func(tx any) error) error {
	if _, err := For(db); err != nil {
		return err // nil, a typed nil or an unknown type: nothing to begin on
	}
	switch v := db.(type) {
	case pgx.Tx, bun.Tx, *bun.Tx, *sql.Tx:
		return fn(db)
	case *bun.DB:
		return v.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { return fn(tx) })
	case bun.Conn:
		return v.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { return fn(tx) })
	case interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	}: // *sql.DB, *sql.Conn
		tx, err := v.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			tx.Rollback() //nolint:errcheck // fn's error is the one to report
			return err
		}
		return tx.Commit()
	case interface {
		Begin(context.Context) (pgx.Tx, error)
	}: // *pgxpool.Pool, *pgx.Conn, *pgxpool.Conn
		return pgx.BeginFunc(ctx, v, func(tx pgx.Tx) error { return fn(tx) })
	}
	return fn(db) // an Execer
}
