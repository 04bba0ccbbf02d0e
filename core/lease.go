package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/internal/dbx"
)

// sqlHoldLease locks the row of attempt ($1 id, $2 token) FOR SHARE, if the
// attempt still holds the job: the rescuer, a cancel and every other write
// of the job wait until the caller's transaction ends, so whatever the
// transaction commits is committed while the lease was the attempt's.
const sqlHoldLease = `SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE`

// HoldLease checks, in the caller's transaction tx, that the attempt of row
// still holds the job's lease, and keeps it held until tx ends: the job's
// row is locked FOR SHARE, so no rescue, cancel or other attempt can take
// the job before tx commits or rolls back. It returns ErrLeaseLost when the
// lease is gone; roll tx back then. Call it last before the commit: the
// lock also holds up the job's heartbeat.
//
// It is the fence of writes other than the job's own outcome (the workflow
// layer's checkpoints): they commit only if the attempt that made them
// still owned the job.
func HoldLease(ctx context.Context, tx DB, row *JobRow) error {
	ex, err := execerFor(tx)
	if err != nil {
		return err
	}
	held := false
	if err := ex.Query(ctx, sqlHoldLease, []any{row.ID, row.LeaseToken.String()}, func(dbx.Scanner) error { held = true; return nil }); err != nil {
		return fmt.Errorf("core: hold lease of job %d: %w", row.ID, err)
	}
	if !held {
		return fmt.Errorf("core: hold lease of job %d: %w", row.ID, ErrLeaseLost)
	}
	return nil
}

// LeaseCheck is HoldLease as a statement, for a batch or pipeline sent in
// one round trip (pgx.Batch runs in one implicit transaction): run with its
// args, it locks the job's row FOR SHARE while row's attempt holds the
// lease, and fails otherwise (IsLeaseLost reports that failure), aborting
// the transaction so that nothing else of it commits.
//
// The lock is taken by the statement itself; relay_hold_lease, which raises
// the failure, is called only when no row was locked (a PL/pgSQL call for
// every check cost as much PostgreSQL time as the lock).
func LeaseCheck(row *JobRow) (sql string, args []any) {
	return sqlLeaseCheck, []any{row.ID, row.LeaseToken.String()}
}

const sqlLeaseCheck = `
SELECT CASE WHEN held.n = 0 THEN relay_hold_lease($1, $2::uuid) END
FROM (SELECT count(*) AS n FROM (
    SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE) AS l) AS held`

// IsLeaseLost reports whether err is ErrLeaseLost or the failure of a
// LeaseCheck statement.
func IsLeaseLost(err error) bool {
	if errors.Is(err, ErrLeaseLost) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RLY02"
}
