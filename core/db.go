package core

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/uptrace/bun"
)

// DB is where a call runs its SQL. It may be:
//
//   - a transaction: pgx.Tx, bun.Tx (or *bun.Tx), *sql.Tx — the call joins it,
//     and nothing it writes is visible until the caller commits;
//   - a pool or connection: *pgxpool.Pool, *pgx.Conn, *pgxpool.Conn, *bun.DB,
//     *sql.DB, *sql.Conn — the call runs as its own single statement.
//
// database/sql handles may use any PostgreSQL driver: parameters are passed as
// strings and integers only. Any other type fails with ErrUnsupportedDB.
type DB any

// execer is the two calls Relay needs from any of the handles above.
type execer interface {
	// exec runs a statement and returns the number of rows it affected.
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	// query runs a statement and calls scan once per row.
	query(ctx context.Context, sql string, args []any, scan func(row scanner) error) error
}

type scanner interface{ Scan(dest ...any) error }

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

func execerFor(db DB) (execer, error) {
	switch v := db.(type) {
	case nil:
		return nil, fmt.Errorf("%w: nil", ErrUnsupportedDB)
	case execer:
		return v, nil
	// bun's handles format queries with bun's own placeholders; Relay's SQL
	// uses $n, so go to the database/sql handle beneath.
	case bun.Tx:
		return sqlExecer{v.Tx}, nil
	case *bun.Tx:
		return sqlExecer{v.Tx}, nil
	case *bun.DB:
		return sqlExecer{v.DB}, nil
	case bun.Conn:
		return sqlExecer{v.Conn}, nil
	case pgxQuerier:
		return pgxExecer{v}, nil
	case sqlQuerier:
		return sqlExecer{v}, nil
	}
	return nil, fmt.Errorf("%w: %T (want a pgx, bun or database/sql transaction, connection or pool)", ErrUnsupportedDB, db)
}

type pgxExecer struct{ q pgxQuerier }

func (e pgxExecer) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (e pgxExecer) query(ctx context.Context, sql string, args []any, scan func(scanner) error) error {
	rows, err := e.q.Query(ctx, sql, args...)
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

type sqlExecer struct{ q sqlQuerier }

func (e sqlExecer) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e sqlExecer) query(ctx context.Context, query string, args []any, scan func(scanner) error) error {
	rows, err := e.q.QueryContext(ctx, query, args...)
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
