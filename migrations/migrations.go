// Package migrations holds Relay's SQL schema as plain, embedded SQL files and
// applies them with bun/migrate.
//
// Migrate is safe to call from many processes at once: it holds a PostgreSQL
// advisory lock for the whole run, and each file runs in its own transaction
// (a file named without .tx runs outside one, statement by statement) and is
// marked applied only after it succeeds.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/migrate"
)

//go:embed *.up.sql
var files embed.FS

// lockKey is the advisory lock key held while migrating: the ASCII bytes of
// "RelayMig", fixed so that every version of Relay agrees on it.
const lockKey int64 = 0x52656c61794d6967 // "RelayMig"

// Table names used by bun/migrate for its bookkeeping.
const (
	table      = "relay_migrations"
	locksTable = "relay_migration_locks"
)

// Result says what Migrate did.
type Result struct {
	// Applied names the migrations applied by this call, in order. Empty when
	// the schema was already current.
	Applied []string
}

// Migrate applies every pending migration to the database behind pool.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (Result, error) {
	sqldb := stdlib.OpenDBFromPool(pool)
	defer sqldb.Close()
	return MigrateDB(ctx, sqldb)
}

// MigrateDB is Migrate for a database/sql handle (any PostgreSQL driver).
func MigrateDB(ctx context.Context, sqldb *sql.DB) (Result, error) {
	return migrateFS(ctx, sqldb, files)
}

// migrateFS applies the migration files of fsys (*.up.sql, each
// <number>_<comment>[.tx].up.sql).
func migrateFS(ctx context.Context, sqldb *sql.DB, fsys fs.FS) (Result, error) {
	// The advisory lock lives on one connection, held for the whole run.
	conn, err := sqldb.Conn(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()
	if err := refuseTxPooling(ctx, sqldb, conn); err != nil {
		return Result{}, err
	}
	if err := lockMigrations(ctx, conn); err != nil {
		return Result{}, err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck // released with the session anyway

	db := bun.NewDB(sqldb, pgdialect.New())
	ms, err := discover(fsys)
	if err != nil {
		return Result{}, err
	}
	m := migrate.NewMigrator(db, ms,
		migrate.WithTableName(table),
		migrate.WithLocksTableName(locksTable),
		migrate.WithMarkAppliedOnSuccess(true),
	)
	if err := m.Init(ctx); err != nil {
		return Result{}, fmt.Errorf("migrations: create bookkeeping tables: %w", err)
	}
	group, err := m.Migrate(ctx)
	var res Result
	if group != nil {
		for _, mg := range group.Migrations {
			res.Applied = append(res.Applied, mg.Name+"_"+mg.Comment)
		}
	}
	if err != nil {
		return res, fmt.Errorf("migrations: apply: %w", err)
	}
	return res, nil
}

// ErrTxPooled says the migrations were given connections that a proxy
// pools per transaction (PgBouncer's pool_mode=transaction): the migration
// lock is a session advisory lock, which there would stay on whichever
// server connection took it, held for the next client, and two migrators
// could both take it. Migrations need a URL that reaches the server
// directly (or through session pooling).
var ErrTxPooled = errors.New("migrations: the connections are pooled per transaction (PgBouncer pool_mode=transaction?): migrations hold a session advisory lock and need a URL that reaches the server directly (docs/deploy.md)")

// refuseTxPooling returns ErrTxPooled when conn, idle between statements,
// and another connection of sqldb in a transaction are served by the same
// backend: a transaction-pooling proxy hands its most recently used server
// connection to the next transaction. Directly, or through session
// pooling, two connections never share a backend.
func refuseTxPooling(ctx context.Context, sqldb *sql.DB, conn *sql.Conn) error {
	other, err := sqldb.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer other.Close()
	var a, b int32
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&a); err != nil {
		return fmt.Errorf("migrations: probe the connection: %w", err)
	}
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: probe the connection: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&b); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
			// The driver's prepared statement met the first connection's
			// on the same backend (duplicate_prepared_statement), or
			// missed it on another (invalid_sql_statement_name).
			return ErrTxPooled
		}
		return fmt.Errorf("migrations: probe the connection: %w", err)
	}
	if a == b {
		return ErrTxPooled
	}
	return nil
}

// lockMigrations takes the migration lock on conn, trying again until it
// gets it or ctx ends. It does not wait in pg_advisory_lock: a session
// waiting there holds a snapshot, and CREATE INDEX CONCURRENTLY, run by the
// migrator holding the lock, waits for every older snapshot of its
// database to go: the two would wait for each other for ever, unseen by
// the deadlock detector (the lock is held by another session of the
// migrator).
func lockMigrations(ctx context.Context, conn *sql.Conn) error {
	backoff := 10 * time.Millisecond
	for {
		var locked bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&locked); err != nil {
			return fmt.Errorf("migrations: take advisory lock: %w", err)
		}
		if locked {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrations: take advisory lock: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// nonTxLockTimeout bounds each lock wait of a migration file run outside
// a transaction (see runSQL); a lower lock_timeout already set (on the
// role, in the URL) is kept.
const nonTxLockTimeout = "2min"

const sqlBoundLockTimeout = `SELECT set_config('lock_timeout',
    CASE WHEN current_setting('lock_timeout')::interval = interval '0'
           OR current_setting('lock_timeout')::interval > $1::text::interval
         THEN $1::text ELSE current_setting('lock_timeout') END, false)`

// fileName is a migration file's name: bun/migrate's <number>_<comment>,
// then .tx.up.sql (run in one transaction) or .up.sql (run outside one,
// statement by statement: the file's parts between --bun:split lines).
var fileName = regexp.MustCompile(`^(\d{1,14})_([0-9a-z_\-]+)(\.tx)?\.up\.sql$`)

// discover registers every migration file of fsys, each run by runSQL. It
// stands in for bun's Migrations.Discover, whose SQL runner (bun v1.2.16)
// drops the error of a failing statement: the migration was reported
// applied, and marked applied (TestFailedMigrationIsNotApplied).
func discover(fsys fs.FS) (*migrate.Migrations, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list files: %w", err)
	}
	ms := migrate.NewMigrations()
	for _, n := range names {
		m := fileName.FindStringSubmatch(n)
		if m == nil {
			return nil, fmt.Errorf("migrations: file %s is not named <number>_<comment>[.tx].up.sql", n)
		}
		text, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", n, err)
		}
		ms.Add(migrate.Migration{Name: m[1], Comment: m[2], Up: runSQL(n, string(text), m[3] != "")})
	}
	return ms, nil
}

// runSQL runs a migration file's text: in one transaction when inTx,
// otherwise each part between --bun:split lines in a statement of its own
// (one part may hold several statements: PostgreSQL runs them as one
// implicit transaction; CREATE INDEX CONCURRENTLY must be a part alone).
func runSQL(name, text string, inTx bool) func(context.Context, *migrate.Migrator, *migrate.Migration) error {
	return func(ctx context.Context, m *migrate.Migrator, _ *migrate.Migration) error {
		db := m.DB().DB
		if inTx {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return fmt.Errorf("%s: begin: %w", name, err)
			}
			if _, err := tx.ExecContext(ctx, text); err != nil {
				tx.Rollback() //nolint:errcheck // the statement's error is the one to report
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := tx.Commit(); err != nil {
				return fmt.Errorf("%s: commit: %w", name, err)
			}
			return nil
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("%s: connect: %w", name, err)
		}
		defer conn.Close()
		// A part's waits are bounded: CREATE INDEX CONCURRENTLY waits for
		// every transaction older than its build, and one of those may
		// never end on its own — an older Relay's migrator waiting in
		// pg_advisory_lock for the lock this run holds (a rolling deploy)
		// waits for us while we wait for it, unseen by the deadlock
		// detector. Every part can run again, so the way out is an error
		// that says what to do.
		if _, err := conn.ExecContext(ctx, sqlBoundLockTimeout, nonTxLockTimeout); err != nil {
			return fmt.Errorf("%s: set lock_timeout: %w", name, err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "RESET lock_timeout") //nolint:errcheck // the connection is returned to database/sql's pool
		for i, part := range splitParts(text) {
			if _, err := conn.ExecContext(ctx, part); err != nil {
				if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
					return fmt.Errorf("%s, part %d: waited up to %s for older transactions to end (an idle-in-transaction session, a long report, or an older relay migrate waiting for the migration lock): end them and migrate again (the file resumes where it stopped): %w",
						name, i+1, nonTxLockTimeout, err)
				}
				return fmt.Errorf("%s, part %d: %w", name, i+1, err)
			}
		}
		return nil
	}
}

// splitParts cuts text at its --bun:split lines, dropping empty parts.
func splitParts(text string) []string {
	var parts []string
	var cur strings.Builder
	flush := func() {
		if strings.TrimSpace(cur.String()) != "" {
			parts = append(parts, cur.String())
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.TrimSpace(line) == "--bun:split" {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return parts
}

// Fingerprint is a short hash of every embedded migration file. Two builds
// with the same fingerprint create the same schema (the test harness names its
// template databases after it).
func Fingerprint() string {
	names, _ := fs.Glob(files, "*.sql")
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := files.ReadFile(n)
		h.Write([]byte(n))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
