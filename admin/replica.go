package admin

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
)

// ReplicaStatus says whether the lists, counts and charts come from a read
// replica (Config.ReadPool) and how far it is behind the primary.
type ReplicaStatus struct {
	Configured bool `json:"configured" doc:"Whether lists, counts and charts are read from a separate read pool (relay serve --read-database-url)"`
	InRecovery bool `json:"in_recovery" doc:"Whether the read pool's server is a standby replaying the primary's WAL (false without a read pool, or when it is a primary itself)"`
	// LagBytes and LagSeconds are null unless InRecovery.
	LagBytes   *int64   `json:"lag_bytes" doc:"WAL the primary has written that the replica has not replayed yet, in bytes; null unless in_recovery"`
	LagSeconds *float64 `json:"lag_seconds" doc:"0 when the replica has replayed all the primary's WAL, else the time since it replayed its last transaction (an upper bound of how stale its answers are); null unless in_recovery"`
}

type replicaOutput struct{ Body ReplicaStatus }

// sqlPrimaryLSN is where the primary's WAL ends now (its insert position:
// an asynchronous commit may not be written out yet).
const sqlPrimaryLSN = `SELECT pg_current_wal_insert_lsn()::text`

// sqlReplicaLag compares a replica's replay position with the primary's
// position $1, read just before: bytes not replayed yet (never below 0:
// the replica may replay past the position while the two are read), and
// the age of the last replayed transaction when some are.
const sqlReplicaLag = `
SELECT pg_is_in_recovery(),
       greatest(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint,
       CASE WHEN pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()) > 0
            THEN coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)::float8
            ELSE 0 END`

// registerReplica registers GET /v1/replica.
func (s *server) registerReplica(api huma.API) {
	huma.Register(api, op("replica-status", http.MethodGet, "/v1/replica",
		"Whether lists, counts and charts come from a read replica, and how far it is behind the primary", "replica"),
		func(ctx context.Context, _ *struct{}) (*replicaOutput, error) {
			out := &replicaOutput{Body: ReplicaStatus{Configured: s.read != s.pool}}
			if !out.Body.Configured {
				return out, nil
			}
			var lsn string
			if err := s.pool.QueryRow(ctx, sqlPrimaryLSN).Scan(&lsn); err != nil {
				return nil, s.internalError("read the primary's WAL position", err)
			}
			var bytes int64
			var seconds float64
			if err := s.read.QueryRow(ctx, sqlReplicaLag, lsn).Scan(&out.Body.InRecovery, &bytes, &seconds); err != nil {
				return nil, s.internalError("read the replica's lag", err)
			}
			if out.Body.InRecovery {
				out.Body.LagBytes, out.Body.LagSeconds = &bytes, &seconds
			}
			return out, nil
		})
}
