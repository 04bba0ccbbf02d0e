package core

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrUndecodableJob: a claimed row holds values the client cannot use (an
// infinite timestamp, an attempt beyond max_attempts, …), written behind
// the API. The job fails alone, dead at once with the reason in its
// last_error and history; the rest of its claim batch runs normally.
var ErrUndecodableJob = errors.New("core: undecodable job row")

// claimedRow is one row of sqlClaim's RETURNING, scanned into types that
// accept every value its columns can hold, so that no single row can fail
// the scan (which would end the whole batch's result set: pgx closes the
// rows on a scan error, and every job of the batch would sit out its
// lease).
type claimedRow struct {
	id                            int64
	kind, queue                   string
	priority                      int16
	attempt, maxAttempts          int32
	runAt, createdAt, attemptedAt pgtype.Timestamptz
	args, meta                    []byte // raw: scanning jsonb into json.RawMessage re-parses it
	token                         uuid.UUID
	orderingKey                   string
	tags                          []pgtype.Text
}

func (r *claimedRow) dest() []any {
	return []any{&r.id, &r.kind, &r.queue, &r.priority, &r.attempt, &r.maxAttempts, &r.runAt,
		&r.createdAt, &r.attemptedAt, &r.args, &r.meta, &r.token, &r.orderingKey, &r.tags}
}

// scanClaimed reads a claim statement's rows. A row the client cannot run
// comes back marked undecodable (it fails alone); only a failure of the
// result set itself is an error.
//
// Rows are read from their wire format by claimDecoder when the result
// came in the formats it reads (the default, extended protocol), else
// with Scan (the simple protocol a transaction-pooling PgBouncer may
// need); a row it cannot read goes to Scan as well.
func scanClaimed(rows pgx.Rows, clientID string) ([]*JobRow, error) {
	defer rows.Close()
	var out []*JobRow
	fds := rows.FieldDescriptions()
	fast := claimedWireFormat(fds)
	d := claimDecoder{fds: fds}
	for rows.Next() {
		var raw claimedRow
		if !fast || !d.decode(rows.RawValues(), &raw) {
			raw = claimedRow{}
			if err := rows.Scan(raw.dest()...); err != nil {
				return nil, fmt.Errorf("claim: scan: %w", err)
			}
		}
		r, err := raw.job(clientID)
		if err != nil {
			r.undecodable = err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return out, nil
}

// job turns a scanned row into the JobRow a worker gets. A row the
// client cannot run still gives a JobRow (enough to fence and record its
// failure) and an error wrapping ErrUndecodableJob that names the cause.
func (r *claimedRow) job(clientID string) (*JobRow, error) {
	j := &JobRow{
		ID: r.id, Kind: r.kind, Queue: r.queue, State: StateClaimed, Priority: int(r.priority),
		Attempt: int(r.attempt), MaxAttempts: int(r.maxAttempts), AttemptedBy: clientID,
		EncodedArgs: r.args, Metadata: r.meta, LeaseToken: r.token, OrderingKey: r.orderingKey,
	}
	var problems []string
	for _, t := range []struct {
		name string
		src  pgtype.Timestamptz
		dst  *time.Time
	}{{"run_at", r.runAt, &j.RunAt}, {"created_at", r.createdAt, &j.CreatedAt}, {"attempted_at", r.attemptedAt, &j.AttemptedAt}} {
		switch {
		case !t.src.Valid:
			problems = append(problems, t.name+" is NULL")
		case t.src.InfinityModifier == pgtype.Infinity:
			problems = append(problems, t.name+" is infinity")
		case t.src.InfinityModifier == pgtype.NegativeInfinity:
			problems = append(problems, t.name+" is -infinity")
		default:
			*t.dst = t.src.Time
		}
	}
	if j.Attempt > j.MaxAttempts {
		problems = append(problems, fmt.Sprintf("attempt %d is beyond max_attempts %d", j.Attempt, j.MaxAttempts))
	}
	for _, t := range r.tags {
		if t.Valid {
			j.Tags = append(j.Tags, t.String)
		}
	}
	if len(problems) > 0 {
		// Fill what the pickup metric reads. RunAt stays zero when unknown:
		// it is the smallest position in claim order, so it never moves the
		// fetch loop's cursor past other jobs.
		now := time.Now()
		for _, t := range []*time.Time{&j.CreatedAt, &j.AttemptedAt} {
			if t.IsZero() {
				*t = now
			}
		}
		return j, fmt.Errorf("%w %d: %s", ErrUndecodableJob, j.ID, strings.Join(problems, "; "))
	}
	return j, nil
}
