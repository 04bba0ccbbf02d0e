package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Declarations is the protocol of things declared in code, owned by a
// namespace and kept alive by live processes (the scheduler's schedules,
// the outbox's subscriptions). A process of the role lists the names it
// declares in its entry (Entry.Namespace, Entry.Declares). Declaring
// upserts them and records the entry in one transaction; a name stored in
// another namespace is taken over only when no live process of that
// namespace declares it (the owner's Upsert checks with relay_process_live
// on the role's entries), and every heartbeat retires what no live process
// of the namespace declares any more. Both run under the namespace's lock,
// and a declaration also under its names' locks.
//
// A heartbeat renews an entry only while it is live: a process found
// expired (it paused past its timeout, and the others may have retired its
// declarations) declares again.
type Declarations struct {
	// Upsert stores the process's declarations in tx, once the locks are
	// held; an error (an owned name) rolls the declaration back.
	Upsert func(ctx context.Context, tx pgx.Tx) error
	// Retire ends the namespace's declarations that no live process of the
	// role declares (relay_process_live on the role's entries).
	Retire func(ctx context.Context, tx pgx.Tx) error
}

// Declare locks the namespace and the declared names, runs d.Upsert,
// records the entry and runs d.Retire, in one transaction. Its
// declarations count for one timeout unless KeepDeclared heartbeats them.
func (p *Process) Declare(ctx context.Context, d Declarations) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLockNamespace, p.e.Role, p.e.Namespace); err != nil {
			return fmt.Errorf("lock namespace %q: %w", p.e.Namespace, err)
		}
		if _, err := tx.Exec(ctx, sqlLockNames, p.e.Role, p.e.Declares); err != nil {
			return fmt.Errorf("lock the declared names: %w", err)
		}
		if err := d.Upsert(ctx, tx); err != nil {
			return err
		}
		if err := p.Register(ctx, tx); err != nil {
			return err
		}
		return d.Retire(ctx, tx)
	})
}

// KeepDeclared heartbeats the entry every Interval until ctx ends, each
// time retiring under the namespace's lock what no live process declares;
// an entry found expired declares again (logged once as a warning). A
// failure is logged with what says whose, and tried at the next interval.
func (p *Process) KeepDeclared(ctx context.Context, d Declarations, log *slog.Logger, what string) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.Interval()):
		}
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlLockNamespace, p.e.Role, p.e.Namespace); err != nil {
				return fmt.Errorf("lock namespace: %w", err)
			}
			alive, err := p.heartbeat(ctx, tx)
			if err != nil {
				return err
			}
			if !alive {
				return errExpired
			}
			return d.Retire(ctx, tx)
		})
		if errors.Is(err, errExpired) {
			log.Warn("relay: "+what+" was taken for dead; declaring again", "namespace", p.e.Namespace, "process_id", p.id)
			err = p.Declare(ctx, d)
		}
		if err != nil && ctx.Err() == nil {
			log.Error("relay: "+what+" heartbeat failed", "namespace", p.e.Namespace, "process_id", p.id, "err", err)
		}
	}
}
