package core

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

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

func execerFor(db DB) (execer, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil (want a pgx, bun or database/sql transaction, connection or pool)", ErrUnsupportedDB)
	}
	// A typed nil (a *pgxpool.Pool or *sql.DB never opened) would panic on
	// first use.
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: a nil %T", ErrUnsupportedDB, db)
	}
	ex, err := dbx.For(db)
	if errors.Is(err, dbx.ErrUnsupported) {
		// dbx's message starts with the sentinel's text: say it once.
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedDB, strings.TrimPrefix(err.Error(), dbx.ErrUnsupported.Error()+": "))
	}
	return ex, err
}
