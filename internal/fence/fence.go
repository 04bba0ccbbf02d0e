// Package fence is the lease fence for writes other than a job's own
// outcome (the workflow layer's checkpoints): they commit only while the
// attempt that made them still holds the job's lease. core is built on
// it (its ErrLeaseLost is this package's), and the layers above core use
// it beside core's public API.
package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/internal/dbx"
)

// ErrLeaseLost: the attempt's lease token no longer matches. core exports
// it as core.ErrLeaseLost.
var ErrLeaseLost = errors.New("core: lease lost")

// sqlHold locks the row of attempt ($1 id, $2 token) FOR SHARE, if the
// attempt still holds the job: the rescuer, a cancel and every other write
// of the job wait until the caller's transaction ends, so whatever the
// transaction commits is committed while the lease was the attempt's.
const sqlHold = `SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE`

// Hold checks, in the transaction ex runs in, that the attempt (job id,
// lease token) still holds the job's lease, and keeps it held until that
// transaction ends: the job's row is locked FOR SHARE, so no rescue,
// cancel or other attempt can take the job before it commits or rolls
// back. It returns an error wrapping ErrLeaseLost when the lease is gone;
// roll the transaction back then. Call it last before the commit: the lock
// also holds up the job's heartbeat.
func Hold(ctx context.Context, ex dbx.Execer, id int64, token uuid.UUID) error {
	held := false
	if err := ex.Query(ctx, sqlHold, []any{id, token.String()}, func(dbx.Scanner) error { held = true; return nil }); err != nil {
		return fmt.Errorf("hold lease of job %d: %w", id, err)
	}
	if !held {
		return fmt.Errorf("hold lease of job %d: %w", id, ErrLeaseLost)
	}
	return nil
}

// Check is Hold as a statement, for a batch or pipeline sent in one round
// trip (pgx.Batch runs in one implicit transaction): run with its args, it
// locks the job's row FOR SHARE while the attempt (id, token) holds the
// lease, and fails otherwise (IsLost reports that failure), aborting the
// transaction so that nothing else of it commits.
//
// The lock is taken by the statement itself; relay_hold_lease, which raises
// the failure, is called only when no row was locked (a PL/pgSQL call for
// every check cost as much PostgreSQL time as the lock).
func Check(id int64, token uuid.UUID) (sql string, args []any) {
	return sqlCheck, []any{id, token.String()}
}

const sqlCheck = `
SELECT CASE WHEN held.n = 0 THEN relay_hold_lease($1, $2::uuid) END
FROM (SELECT count(*) AS n FROM (
    SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE) AS l) AS held`

// IsLost reports whether err is ErrLeaseLost or the failure of a Check
// statement.
func IsLost(err error) bool {
	if errors.Is(err, ErrLeaseLost) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RLY02"
}
