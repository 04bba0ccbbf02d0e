package core

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Limit caps how much of a queue's, a kind's or a tag's work runs, across
// every process and client on the database. Set exactly one of Queue, Kind
// and Tag. A tag names a key of your choosing carried by jobs
// (EnqueueOpts.Tags): "api:stripe", "tenant:acme".
//
// Limits are enforced when jobs are claimed: a claim of a limited queue
// locks the limits that apply, counts the jobs claimed right now, and
// claims no more than they allow, in one transaction. So the promise holds
// for claimed jobs, whichever process holds them: at most MaxRunning are
// claimed (running or prefetched) at once. A job counts from its claim
// until its outcome is recorded, which is a little longer than its handler
// runs.
//
// Rate limits count claims in consecutive windows of Per: at most Rate
// claims in each window; a window starts at the first claim after the
// previous one ended. (Any span of length Per therefore holds at most
// 2×Rate starts, at a window boundary.)
//
// Clients see a new or removed limit within their PollInterval, and a
// slot freed in one process is used by another at its next poll: keep the
// PollInterval of limited queues short. Claims of limited work serialise
// on the limits' rows and cost three more statements each; see
// docs/benchmarks.md. A kind or a tag may be in any queue, so a limit on a
// kind or a tag puts the claims of every queue on that path.
//
// A limit binds claims, not enqueues: jobs beyond it wait queued. Jobs
// claimed before a limit was set or lowered run to the end; the limit
// then admits no new claim until the count is below it.
type Limit struct {
	// Queue names the queue limited (every kind in it).
	Queue string
	// Kind names the kind limited (in every queue).
	Kind string
	// Tag limits the jobs carrying this tag (of any kind, in any queue).
	Tag string
	// MaxRunning is the most jobs claimed at once. 0: no concurrency limit.
	MaxRunning int
	// Rate is the most claims per Per. 0: no rate limit.
	Rate int
	// Per is the rate's window. Default 1s.
	Per time.Duration
}

func (l Limit) scope() (scope, name string, err error) {
	set := 0
	for _, v := range []string{l.Queue, l.Kind, l.Tag} {
		if v != "" {
			set++
		}
	}
	switch {
	case set != 1:
		return "", "", &ValidationError{Field: "limit", Reason: "set exactly one of Queue, Kind and Tag"}
	case l.Queue != "":
		return "queue", l.Queue, validateName("queue", l.Queue, 128)
	case l.Kind != "":
		return "kind", l.Kind, validateName("kind", l.Kind, 255)
	default:
		return "tag", l.Tag, validateName("tag", l.Tag, 255)
	}
}

// SetLimit creates or replaces a global limit (its rate window starts
// over). A limit with neither MaxRunning nor Rate limits nothing.
func SetLimit(ctx context.Context, db DB, l Limit) error {
	scope, name, err := l.scope()
	if err != nil {
		return err
	}
	l.Per = cmpOr(l.Per, time.Second)
	switch {
	case l.MaxRunning < 0 || l.MaxRunning > MaxAttemptsLimit:
		return &ValidationError{Field: "max running", Reason: fmt.Sprintf("%d is outside 0..%d", l.MaxRunning, MaxAttemptsLimit)}
	case l.Rate < 0 || l.Rate > MaxAttemptsLimit:
		return &ValidationError{Field: "rate", Reason: fmt.Sprintf("%d is outside 0..%d", l.Rate, MaxAttemptsLimit)}
	case l.Per < time.Millisecond:
		return &ValidationError{Field: "per", Reason: fmt.Sprintf("%s is below 1ms", l.Per)}
	}
	ex, err := execerFor(db)
	if err != nil {
		return err
	}
	if _, err := ex.Exec(ctx, sqlSetLimit, scope, name, l.MaxRunning, l.Rate, l.Per.Microseconds()); err != nil {
		return fmt.Errorf("core: set limit on %s %q: %w", scope, name, err)
	}
	return nil
}

// DeleteLimit removes the limit on a queue, a kind or a tag (set one of
// l.Queue, l.Kind and l.Tag); removing none is no error.
func DeleteLimit(ctx context.Context, db DB, l Limit) error {
	scope, name, err := l.scope()
	if err != nil {
		return err
	}
	ex, err := execerFor(db)
	if err != nil {
		return err
	}
	if _, err := ex.Exec(ctx, sqlDeleteLimit, scope, name); err != nil {
		return fmt.Errorf("core: delete limit on %s %q: %w", scope, name, err)
	}
	return nil
}

// Limits lists every global limit.
func Limits(ctx context.Context, db DB) ([]Limit, error) {
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	var out []Limit
	err = ex.Query(ctx, sqlListLimits, nil, func(r scanner) error {
		var scope, name string
		var l Limit
		var perUS int64
		if err := r.Scan(&scope, &name, &l.MaxRunning, &l.Rate, &perUS); err != nil {
			return err
		}
		switch scope {
		case "queue":
			l.Queue = name
		case "kind":
			l.Kind = name
		default:
			l.Tag = name
		}
		l.Per = time.Duration(perUS) * time.Microsecond
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("core: list limits: %w", err)
	}
	return out, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// limitState caches, for one queue, whether any limit may apply to its
// claims, re-read at most every PollInterval.
type limitState struct {
	mu      sync.Mutex
	at      time.Time
	applies bool
}

func (s *limitState) apply(ctx context.Context, c *Client, queue string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < c.cfg.PollInterval {
		return s.applies
	}
	var applies bool
	if err := c.own.QueryRow(ctx, sqlLimitsApply, queue).Scan(&applies); err != nil {
		// Keep the last answer; the next claim asks again. With none yet,
		// assume limits: the limited claim then fails the same way (the
		// database is unreachable, say) rather than run unlimited.
		return s.applies || s.at.IsZero()
	}
	s.at, s.applies = time.Now(), applies
	return applies
}

// limitRow is a limit as a claim sees it, with what the claim counts.
type limitRow struct {
	scope, name             string
	maxRunning, rate        int
	perUS                   int64
	windowStart, now        time.Time
	windowCount             int
	claimed                 int // by this claim
	newWindow               bool
	running, runningInQueue int
}

// remaining is how many more claims the limit allows now (-1: no bound).
func (l *limitRow) remaining() int {
	left := -1
	if l.maxRunning > 0 {
		left = max(l.maxRunning-l.running, 0)
	}
	if l.rate > 0 {
		used := l.windowCount
		if !l.now.Before(l.windowStart.Add(time.Duration(l.perUS) * time.Microsecond)) {
			l.newWindow, used = true, 0
		}
		r := max(l.rate-used, 0)
		if left < 0 || r < left {
			left = r
		}
	}
	return left
}

// claimLimited claims up to limit jobs of the queue under the global
// limits, in one transaction (see sqlLockLimits).
func (q *queue) claimLimited(ctx context.Context, limit int) ([]*JobRow, error) {
	c := q.client
	var out []*JobRow
	err := pgx.BeginFunc(ctx, c.own, func(tx pgx.Tx) error {
		lock := sqlLockLimits
		if c.cfg.SynchronousClaims {
			lock = sqlLockLimitsSync
		}
		rows, err := tx.Query(ctx, lock, q.name)
		if err != nil {
			return err
		}
		var lims []*limitRow
		var kinds, tags []string
		for rows.Next() {
			l := &limitRow{}
			if err := rows.Scan(&l.scope, &l.name, &l.maxRunning, &l.rate, &l.perUS, &l.windowStart, &l.windowCount, &l.now); err != nil {
				rows.Close()
				return err
			}
			lims = append(lims, l)
			switch l.scope {
			case "kind":
				kinds = append(kinds, l.name)
			case "tag":
				tags = append(tags, l.name)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, sqlCountRunning, q.name, kinds)
		if err != nil {
			return err
		}
		byKind, inQueue := map[string]int{}, 0
		for rows.Next() {
			var kind string
			var ofQueue bool
			var n int
			if err := rows.Scan(&kind, &ofQueue, &n); err != nil {
				rows.Close()
				return err
			}
			byKind[kind] += n
			if ofQueue {
				inQueue += n
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		byTag := map[string]int{}
		if len(tags) > 0 {
			rows, err = tx.Query(ctx, sqlCountRunningTagged, tags)
			if err != nil {
				return err
			}
			for rows.Next() {
				var tag string
				var n int
				if err := rows.Scan(&tag, &n); err != nil {
					rows.Close()
					return err
				}
				byTag[tag] = n
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		var blocked, capKinds, blockedTags, capTags []string
		var caps, tagCaps []int32
		for _, l := range lims {
			switch l.scope {
			case "queue":
				l.running = inQueue
			case "kind":
				l.running = byKind[l.name]
			default:
				l.running = byTag[l.name]
			}
			left := l.remaining()
			switch {
			case left < 0:
			case l.scope == "queue":
				limit = min(limit, left)
			case l.scope == "kind" && left == 0:
				blocked = append(blocked, l.name)
			case l.scope == "kind":
				capKinds, caps = append(capKinds, l.name), append(caps, int32(min(left, limit)))
			case left == 0:
				blockedTags = append(blockedTags, l.name)
			default:
				capTags, tagCaps = append(capTags, l.name), append(tagCaps, int32(min(left, limit)))
			}
		}
		if limit > 0 {
			rows, err = tx.Query(ctx, sqlClaimLimited, q.name, limit, c.cfg.LeaseDuration.Milliseconds(), c.cfg.ID,
				leaseToken(uuid.New()), nonNil(blocked), nonNil(capKinds), nonNil(caps), min(4*limit, limit+1000),
				nonNil(blockedTags), nonNil(capTags), nonNil(tagCaps))
			if err != nil {
				return err
			}
			if out, err = scanClaimed(rows, c.cfg.ID); err != nil {
				return err
			}
		}
		// Count the claims against the rate windows.
		for _, l := range lims {
			if l.rate == 0 {
				continue
			}
			for _, r := range out {
				if l.scope == "queue" || (l.scope == "kind" && r.Kind == l.name) || (l.scope == "tag" && slices.Contains(r.Tags, l.name)) {
					l.claimed++
				}
			}
			start, n := l.windowStart, l.windowCount+l.claimed
			if l.newWindow {
				if l.claimed == 0 {
					continue // the next claim starts the window
				}
				start, n = l.now, l.claimed
			} else if l.claimed == 0 {
				continue
			}
			if _, err := tx.Exec(ctx, sqlAdvanceWindow, l.scope, l.name, start, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim under limits: %w", err)
	}
	c.stats.claimed.Add(int64(len(out)))
	return out, nil
}
