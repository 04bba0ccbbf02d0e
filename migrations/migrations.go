// Package migrations holds Relay's SQL schema as plain, embedded SQL files and
// applies them with bun/migrate.
//
// Migrate is safe to call from many processes at once: it holds a PostgreSQL
// advisory lock for the whole run, and each file runs in its own transaction
// and is marked applied only after it succeeds.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/migrate"
)

//go:embed *.sql
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
	// The advisory lock lives on one connection, held for the whole run.
	conn, err := sqldb.Conn(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return Result{}, fmt.Errorf("migrations: take advisory lock: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck // released with the session anyway

	db := bun.NewDB(sqldb, pgdialect.New())
	ms := migrate.NewMigrations()
	if err := ms.Discover(files); err != nil {
		return Result{}, fmt.Errorf("migrations: read embedded files: %w", err)
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
