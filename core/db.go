package core

import (
	"github.com/relayq/relay/internal/dbx"
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

type (
	execer  = dbx.Execer
	scanner = dbx.Scanner
)

func execerFor(db DB) (execer, error) { return dbx.For(db) }
