package workflowtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The virtual clock. The engine reads time in SQL (now(), clock_timestamp():
// a sleep's wake_at, a snooze's run_at, the claim's due check, leases) and
// in Go (workflow.Now, the attempt log). In SQL it is moved without a
// change to any statement: the environment's database has a schema,
// clockSchema, whose now() and clock_timestamp() (and the other current-time
// functions) are PostgreSQL's plus an offset kept in a one-row table, and
// the environment's connections put that schema in their search_path
// before pg_catalog, which PostgreSQL then searches last: every unqualified
// now() the engine's statements and its triggers call (plpgsql resolves
// names at run time) is the virtual one. Column defaults were bound to
// pg_catalog's at migration and keep the real time (created_at, say). In
// Go the offset reaches the engine through internal/wfhook.

// clockSchema holds the virtual clock.
const clockSchema = "relay_virtual_time"

// sqlInstallClock makes the clock, its offset zero.
var sqlInstallClock = []string{
	`CREATE SCHEMA IF NOT EXISTS ` + clockSchema,
	`CREATE TABLE IF NOT EXISTS ` + clockSchema + `.clock (
		one boolean PRIMARY KEY DEFAULT true CHECK (one),
		skip interval NOT NULL DEFAULT '0')`,
	`INSERT INTO ` + clockSchema + `.clock DEFAULT VALUES ON CONFLICT (one) DO NOTHING`,
	`CREATE OR REPLACE FUNCTION ` + clockSchema + `.now() RETURNS timestamptz LANGUAGE sql STABLE
		AS $$ SELECT pg_catalog.now() + (SELECT skip FROM ` + clockSchema + `.clock) $$`,
	`CREATE OR REPLACE FUNCTION ` + clockSchema + `.transaction_timestamp() RETURNS timestamptz LANGUAGE sql STABLE
		AS $$ SELECT pg_catalog.transaction_timestamp() + (SELECT skip FROM ` + clockSchema + `.clock) $$`,
	`CREATE OR REPLACE FUNCTION ` + clockSchema + `.statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE
		AS $$ SELECT pg_catalog.statement_timestamp() + (SELECT skip FROM ` + clockSchema + `.clock) $$`,
	`CREATE OR REPLACE FUNCTION ` + clockSchema + `.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
		AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT skip FROM ` + clockSchema + `.clock) $$`,
}

// sqlSetClock moves the clock to $1 (never back) and returns its offset
// from the real clock, in microseconds.
const sqlSetClock = `
UPDATE ` + clockSchema + `.clock SET skip = greatest(skip, $1::timestamptz - pg_catalog.clock_timestamp())
RETURNING (extract(epoch FROM skip) * 1000000)::bigint`

// installClock installs the clock in the database behind admin and
// returns the search_path that puts it in use.
func installClock(ctx context.Context, admin *pgxpool.Pool) (string, error) {
	for _, q := range sqlInstallClock {
		if _, err := admin.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("workflowtest: install the virtual clock: %w", err)
		}
	}
	var path string
	if err := admin.QueryRow(ctx, `SHOW search_path`).Scan(&path); err != nil {
		return "", fmt.Errorf("workflowtest: read search_path: %w", err)
	}
	var keep []string
	for _, p := range strings.Split(path, ",") {
		if p = strings.TrimSpace(p); p != "" && p != "pg_catalog" && p != clockSchema {
			keep = append(keep, p)
		}
	}
	return strings.Join(append(keep, clockSchema, "pg_catalog"), ", "), nil
}

// setClock moves the virtual clock to at (never back) and returns its
// offset from the real clock.
func setClock(ctx context.Context, pool *pgxpool.Pool, at time.Time) (time.Duration, error) {
	var us int64
	if err := pool.QueryRow(ctx, sqlSetClock, at).Scan(&us); err != nil {
		return 0, fmt.Errorf("workflowtest: move the virtual clock to %s: %w", at.Format(time.RFC3339Nano), err)
	}
	return time.Duration(us) * time.Microsecond, nil
}
