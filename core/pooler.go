package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrStatementCache says the client's connections are pooled per
// transaction (a PgBouncer in pool_mode transaction, say) while pgx caches
// prepared statements on them, which cannot work there: a statement
// prepared on one server connection is missing on the next, or already
// there under another client's name.
var ErrStatementCache = errors.New("core: the connections are pooled per transaction (PgBouncer pool_mode=transaction?) but pgx prepares and caches statements on them: add default_query_exec_mode=exec (or simple_protocol, cache_describe, describe_exec) to the database URL (docs/deploy.md)")

// ErrMissingGrants says the role the client connects as lacks a privilege
// on one of Relay's tables or functions that its work needs; the error
// wrapping it names the role, each table or function and each privilege
// (docs/deploy.md lists the grants).
var ErrMissingGrants = errors.New("core: the role lacks privileges on Relay's tables or functions")

// sqlMissingGrants lists the privileges the connected role lacks on the
// relay_* tables and functions of the schema relay_jobs resolves to
// through search_path, owned by relay_jobs' owner (the migrations' role:
// an application's own relay_-named objects beside them are not Relay's): SELECT, INSERT, UPDATE and DELETE on each table,
// but only SELECT on the migrations' bookkeeping, which only the owner
// writes; EXECUTE on each function but the trigger functions (a trigger's
// own function needs no EXECUTE to fire; the functions Relay's statements
// and its triggers' WHEN clauses call do). PostgreSQL grants EXECUTE to
// PUBLIC by default, so only an install that revoked it can lack one.
// Nothing when relay_jobs is not found (an unmigrated database is another
// error).
const sqlMissingGrants = `
WITH ns AS (SELECT relnamespace AS oid, relowner AS owner FROM pg_class WHERE oid = to_regclass('relay_jobs'))
SELECT current_user::text, coalesce(string_agg(format('%s (%s)', name, missing), '; ' ORDER BY name), '')
FROM (
    SELECT c.relname::text AS name, array_to_string(ARRAY(
        SELECT p FROM unnest(CASE WHEN c.relname IN ('relay_migrations', 'relay_migration_locks')
                                  THEN ARRAY['SELECT'] ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) AS p
        WHERE NOT has_table_privilege(c.oid, p)), ', ') AS missing
    FROM pg_class AS c, ns
    WHERE c.relnamespace = ns.oid AND c.relowner = ns.owner AND c.relname LIKE 'relay\_%' AND c.relkind IN ('r', 'p')
    UNION ALL
    SELECT f.oid::regprocedure::text, 'EXECUTE'
    FROM pg_proc AS f, ns
    WHERE f.pronamespace = ns.oid AND f.proowner = ns.owner AND f.proname LIKE 'relay\_%' AND f.prokind = 'f'
      AND f.prorettype <> 'trigger'::regtype AND NOT has_function_privilege(f.oid, 'EXECUTE')
) AS t
WHERE missing <> ''`

// startupRefused says whether err is a server (or pooler) refusing a
// startup parameter: PgBouncer accepts only a few ("unsupported startup
// parameter: lock_timeout") unless told to ignore them.
func startupRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "unsupported startup parameter")
}

// probe is what Start learns about the client's connections.
type probe struct {
	// reached: the probe connected; the rest is known.
	reached bool
	// noStartupLock: the server refused lock_timeout as a startup
	// parameter, and the bookkeeping pool goes without it.
	noStartupLock bool
	// role and missing: the connected role, and the privileges it lacks
	// (sqlMissingGrants), empty when it has them all.
	role, missing string
	// txPooled: two client connections were handed the same server
	// connection one after the other: the connections are pooled per
	// transaction (or per statement), and no session state survives a
	// transaction.
	txPooled bool
}

// probeConnections connects twice with cc, bounded by a few seconds, and
// tells which privileges on Relay's tables the role lacks, whether a pooler in between refuses lock_timeout as a startup
// parameter (cc is then changed to go without it) and whether it pools per
// transaction: the first connection's server goes back to the pooler once
// its statement ends, and PgBouncer hands its most recently used server to
// the next transaction, the second connection's, which then reports the
// same backend. A server that cannot be reached leaves the probe unknown
// (reached false): the loops report that themselves.
func probeConnections(ctx context.Context, cc *pgx.ConnConfig) probe {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var p probe
	first, err := pgx.ConnectConfig(ctx, cc)
	if err != nil && startupRefused(err) {
		if _, ok := cc.RuntimeParams["lock_timeout"]; ok {
			delete(cc.RuntimeParams, "lock_timeout")
			p.noStartupLock = true
			first, err = pgx.ConnectConfig(ctx, cc)
		}
	}
	if err != nil {
		return p
	}
	defer first.Close(context.WithoutCancel(ctx))
	if err := first.QueryRow(ctx, sqlMissingGrants, pgx.QueryExecModeSimpleProtocol).Scan(&p.role, &p.missing); err != nil {
		return p
	}
	second, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return p
	}
	defer second.Close(context.WithoutCancel(ctx))
	var a, b int32
	if err := first.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&a); err != nil {
		return p
	}
	err = pgx.BeginFunc(ctx, second, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&b)
	})
	if err != nil {
		return p
	}
	p.reached, p.txPooled = true, a == b
	return p
}

// cachesStatements says whether mode prepares named statements on the
// connection, which a transaction-pooling proxy cannot keep.
func cachesStatements(mode pgx.QueryExecMode) bool {
	return mode == pgx.QueryExecModeCacheStatement
}

// checkPooling probes the client's connections at Start (see
// probeConnections) and applies what it found to the bookkeeping pools'
// settings cc: an error when they cannot work (ErrMissingGrants,
// ErrStatementCache), else
// whether to listen, each finding said in one log line.
func (c *Client) checkPooling(ctx context.Context, cc *pgx.ConnConfig) (listen bool, err error) {
	p := probeConnections(ctx, cc)
	if p.noStartupLock {
		c.logger.Info("relay: the server refused lock_timeout as a startup parameter (a pooler such as PgBouncer); the bookkeeping connections go without it: set lock_timeout on the role instead (docs/deploy.md)",
			"client_id", c.cfg.ID)
	}
	if p.missing != "" {
		return false, fmt.Errorf("core: start: %w: role %s lacks %s (grant them as docs/deploy.md lists)", ErrMissingGrants, p.role, p.missing)
	}
	if !p.txPooled {
		return true, nil
	}
	if cachesStatements(c.pool.Config().ConnConfig.DefaultQueryExecMode) {
		return false, fmt.Errorf("core: start: %w", ErrStatementCache)
	}
	if c.cfg.ListenerURL == "" {
		c.logger.Warn("relay: the connections are pooled per transaction and Config.ListenerURL is empty: not listening; workers find new jobs by polling every PollInterval, and cancellations of running jobs at their next heartbeat (docs/deploy.md)",
			"client_id", c.cfg.ID, "poll_interval", c.cfg.PollInterval)
		return false, nil
	}
	return true, nil
}
