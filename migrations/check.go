package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotMigrated is matched (errors.Is) by the error of a process that
// found migrations pending on its database: a *NotMigratedError.
var ErrNotMigrated = errors.New("database not migrated")

// NotMigratedError says which embedded migrations the database lacks. Its
// message names the command that applies them.
type NotMigratedError struct {
	// Pending names the migrations not applied (see Pending).
	Pending []string
}

func (e *NotMigratedError) Error() string {
	noun := "migrations"
	if len(e.Pending) == 1 {
		noun = "migration"
	}
	return fmt.Sprintf("database not migrated: %d %s pending — run `relay migrate`", len(e.Pending), noun)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Check returns a *NotMigratedError when migrations are pending on the
// database behind pool, nil when its schema is current, and the error when
// the database could not be asked (unreachable, a bad URL). A role that may
// not read the bookkeeping table cannot tell: Check returns nil for it, and
// the process goes on as it would without the check. Check changes
// nothing; only Migrate does.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	pending, err := Pending(ctx, pool)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		return nil
	case err != nil:
		return err
	case len(pending) > 0:
		return &NotMigratedError{Pending: pending}
	}
	return nil
}
