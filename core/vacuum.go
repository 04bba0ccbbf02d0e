package core

import (
	"context"
	"log/slog"
	"time"
)

// sqlAutovacuumOff reports whether autovacuum is off for the server or for
// relay_jobs alone. Either way dead rows pile up in front of the claim's
// index scan until someone runs VACUUM (docs/benchmarks.md, "vacuum").
const sqlAutovacuumOff = `
SELECT NOT current_setting('autovacuum')::boolean,
       coalesce((SELECT NOT option_value::boolean
                   FROM pg_options_to_table(c.reloptions)
                  WHERE option_name = 'autovacuum_enabled'), false)
  FROM pg_class c
 WHERE c.oid = 'relay_jobs'::regclass`

// checkAutovacuum logs one warning when autovacuum cannot keep relay_jobs
// small. It is advice, not a precondition: any error (a role that cannot
// read the setting, a slow server) is ignored after a short bound.
func (c *Client) checkAutovacuum(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var serverOff, tableOff bool
	if err := c.pool.QueryRow(ctx, sqlAutovacuumOff).Scan(&serverOff, &tableOff); err != nil {
		return
	}
	switch {
	case serverOff:
		c.logger.Warn("relay: autovacuum is off on this PostgreSQL server (autovacuum = off); dead rows in relay_jobs will slow every claim until VACUUM runs: turn autovacuum on, or run VACUUM relay_jobs every minute or so",
			slog.String("client", c.cfg.ID))
	case tableOff:
		c.logger.Warn("relay: autovacuum is disabled for relay_jobs (autovacuum_enabled = false); dead rows will slow every claim until VACUUM runs: ALTER TABLE relay_jobs RESET (autovacuum_enabled)",
			slog.String("client", c.cfg.ID))
	}
}
