package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/jobinsert"
)

// DefaultQueue is the queue of jobs enqueued without one.
const DefaultQueue = "default"

// DefaultMaxAttempts is the number of attempts of a job enqueued without one.
const DefaultMaxAttempts = 25

// MaxPriority is the largest (least urgent) priority.
const MaxPriority = 32767

// MaxAttemptsLimit is the largest MaxAttempts (the column is a 32-bit
// integer).
const MaxAttemptsLimit = math.MaxInt32

// EnqueueOpts tune one enqueue. The zero value (or nil) means: queue
// "default", priority 0, run now, 25 attempts, no metadata, no tags. Set
// fields (non-zero, or non-nil for Priority) override the kind's defaults
// from JobArgsWithOpts.
type EnqueueOpts struct {
	// Queue names the queue; workers serve queues by name.
	Queue string
	// Priority orders runnable jobs within a queue: 0 runs first, larger
	// numbers later, up to MaxPriority. Nil means the kind's default, else
	// 0. A pointer so that 0 can override a kind's default: write
	// Priority: new(0) (Go 1.26's new(expr)).
	Priority *int
	// RunAt makes the job runnable no earlier than this instant. Use Delay to
	// count from the database's clock instead of this process's.
	RunAt time.Time
	// Delay makes the job runnable this long after the database's now().
	Delay time.Duration
	// MaxAttempts is how many times the job may start before it is dead.
	MaxAttempts int
	// Metadata is stored with the job as a JSON object.
	Metadata map[string]any
	// Tags label the job for people and tools: stored with it, returned in
	// JobRow.Tags and matched by JobList's filter. At most MaxTags, each 1
	// to 255 bytes of UTF-8 without NUL; duplicates are dropped. Set tags
	// replace the kind's default tags.
	Tags []string
	// OrderingKey, when set, makes the job wait for every earlier job of its
	// queue with the same key: such jobs run one at a time, in enqueue (id)
	// order, while different keys run in parallel. A dead job blocks its key
	// until it is requeued or cancelled (see BlockedKeys). Ids are assigned
	// at insert: jobs of one key enqueued by concurrent transactions are
	// ordered by insert, not commit — enqueue a key's jobs from one producer
	// at a time (the outbox serialises its publishers per key).
	OrderingKey string
	// Unique, when set, makes the job unique by a key: while a job with the
	// same key is in one of the unique states, the enqueue inserts nothing
	// and returns that job, with EnqueueResult.Duplicate set.
	Unique *UniqueOpts
}

// UniqueOpts say what makes a job a duplicate. The key is always scoped by
// the job's kind. Uniqueness is enforced by a unique index, so it holds
// under concurrent enqueues from any number of processes, in batches too.
type UniqueOpts struct {
	// Key is the uniqueness key. Empty means: derive it from the job's
	// encoded args, so jobs of a kind with equal args are duplicates.
	Key string
	// Period, when set, adds the time bucket to the key (this process's
	// clock truncated to Period): at most one job per key per period.
	Period time.Duration
	// States are the states in which an existing job blocks a new one. They
	// must include StateQueued and StateClaimed (so a retry never collides);
	// add StateSucceeded, say, to block repeats of work already done.
	// Default: queued and claimed.
	States []JobState
}

// EnqueueParams is one job of a batch for EnqueueMany.
type EnqueueParams struct {
	Args JobArgs
	Opts *EnqueueOpts
}

// EnqueueResult says what an enqueue wrote.
type EnqueueResult struct {
	// ID is the new job's id or, for a duplicate, the existing job's.
	ID int64
	// Duplicate reports that a unique job was not inserted because the job
	// ID already holds its key.
	Duplicate bool
}

// Enqueue writes one job through db. Given a transaction, the job exists only
// if and when that transaction commits. Bad input (an empty kind, args that do
// not encode, a negative priority or delay) is a *ValidationError and nothing
// is written.
func Enqueue(ctx context.Context, db DB, args JobArgs, opts *EnqueueOpts) (EnqueueResult, error) {
	res, err := EnqueueMany(ctx, db, []EnqueueParams{{Args: args, Opts: opts}})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueMany writes a batch of jobs in one statement and one round trip,
// returning their results in the order given. Either every job is written or,
// on any error, none is.
//
// Enqueue and EnqueueMany trace and count with OpenTelemetry's global
// providers; a Client's Enqueue methods use the client's (see
// docs/observability.md).
func EnqueueMany(ctx context.Context, db DB, params []EnqueueParams) ([]EnqueueResult, error) {
	return enqueueMany(ctx, db, params, nil, nil, jobinsert.DefaultWakeWindow, nil)
}

// enqueueMany is EnqueueMany tracing with tp and counting with ctr (nil:
// the global providers'), coalescing its wake-up on a pool over wake (see
// jobinsert.Wake). local, when not nil, is given the queues to wake after
// an enqueue that is its own transaction committed, wakes what it can in
// this process, and returns those still to notify (Client.wakeLocal).
func enqueueMany(ctx context.Context, db DB, params []EnqueueParams, tp trace.TracerProvider, ctr metric.Int64Counter, wake time.Duration, local func([]string) []string) ([]EnqueueResult, error) {
	if len(params) == 0 {
		return nil, nil
	}
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	rows := make([]enqueueRow, len(params))
	for i, p := range params {
		r, err := prepareEnqueue(p.Args, p.Opts)
		if err != nil {
			if len(params) > 1 {
				return nil, fmt.Errorf("core: enqueue job %d of %d: %w", i+1, len(params), err)
			}
			return nil, err
		}
		rows[i] = r
	}
	// The producer span; its trace context goes into every job's metadata
	// (once: retries never touch it), so each attempt can join the trace.
	ctx, span, tc := startEnqueueSpan(ctx, tp, rows[0].Queue, len(rows))
	defer span.End()
	if tc != nil {
		for i := range rows {
			if rows[i].Metadata, err = withTraceMetadata(rows[i].Metadata, tc); err != nil {
				span.SetStatus(codes.Error, err.Error())
				return nil, fmt.Errorf("core: enqueue: trace metadata: %w", err)
			}
		}
	}
	ownTx := !inTransaction(db)
	var results []EnqueueResult
	if c, ok := copyable(db, rows); ok {
		results, err = enqueueCopy(ctx, c, rows, ownTx)
		if err != nil {
			err = fmt.Errorf("core: enqueue: %w", err)
		}
	} else {
		results, err = enqueueRows(ctx, ex, rows, ownTx)
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	if len(results) == 1 {
		span.SetAttributes(attribute.String("messaging.message.id", strconv.FormatInt(results[0].ID, 10)))
	}
	countEnqueued(ctx, ctr, rows, results)
	if ownTx {
		notifyQueues(ctx, db, ex, rows, results, wake, local)
	}
	return results, nil
}

// inTransaction reports whether db is a caller's transaction: then the
// insert trigger's NOTIFY rides on its commit. Otherwise the enqueue is its
// own transaction and notifies after it (notifyQueues).
func inTransaction(db DB) bool { return dbx.InTransaction(db) }

// notifyQueues wakes the workers of the queues that got a job runnable now,
// after the enqueue on db committed (see jobinsert.Wake).
func notifyQueues(ctx context.Context, db DB, ex execer, rows []enqueueRow, results []EnqueueResult, window time.Duration, local func([]string) []string) {
	queues := jobinsert.QueuesToWake(rows, func(i int) bool { return !results[i].Duplicate })
	if local != nil && len(queues) > 0 {
		queues = local(queues)
	}
	jobinsert.Wake(ctx, db, ex, queues, window)
}

// countEnqueued adds the jobs written (not the duplicates) to ctr (nil:
// the relay.jobs.enqueued counter of the global meter), by queue and kind.
func countEnqueued(ctx context.Context, ctr metric.Int64Counter, rows []enqueueRow, results []EnqueueResult) {
	jobinsert.Count(ctx, ctr, rows, func(i int) bool { return !results[i].Duplicate })
}

// enqueueRows writes prepared rows in one statement; ownTx says the
// statement is its own transaction, which then leaves the wake-up to the
// caller.
func enqueueRows(ctx context.Context, ex execer, rows []enqueueRow, ownTx bool) ([]EnqueueResult, error) {
	// Unique jobs go through the statement with ON CONFLICT (the plain one
	// skips that cost). A key repeated within the batch is sent once; the
	// repeats are duplicates of the first.
	sql, firstOf := sqlEnqueue, make([]int, len(rows))
	var send []enqueueRow
	seen := map[string]int{}
	for i, r := range rows {
		firstOf[i] = i
		if r.UniqueKey != nil {
			sql = sqlEnqueueUnique
			if j, dup := seen[*r.UniqueKey]; dup {
				firstOf[i] = j
				continue
			}
			seen[*r.UniqueKey] = i
		}
		send = append(send, r)
	}
	if ownTx {
		if sql == sqlEnqueue {
			sql = sqlEnqueueNotifyAfter
		} else {
			sql = sqlEnqueueUniqueNotifyAfter
		}
	}
	batch := jobinsert.AppendBatch(make([]byte, 0, 128*len(send)), send)
	sent := make([]EnqueueResult, 0, len(send))
	err := ex.Query(ctx, sql, []any{string(batch)}, func(row scanner) error {
		var r EnqueueResult
		if err := row.Scan(&r.ID, &r.Duplicate); err != nil {
			return err
		}
		sent = append(sent, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("core: enqueue: %w", err)
	}
	if len(sent) != len(send) {
		return nil, fmt.Errorf("core: enqueue: wrote %d of %d jobs", len(sent), len(send))
	}
	if err := lookupDuplicates(ctx, ex, send, sent); err != nil {
		return nil, err
	}
	results := make([]EnqueueResult, len(rows))
	k := 0
	for i := range rows {
		if firstOf[i] != i {
			results[i] = EnqueueResult{ID: results[firstOf[i]].ID, Duplicate: true}
			continue
		}
		results[i] = sent[k]
		k++
	}
	return results, nil
}

// lookupDuplicates fills in the ids of duplicates whose existing job was
// committed after the enqueue statement's snapshot (sqlEnqueueUnique gives
// them id 0).
func lookupDuplicates(ctx context.Context, ex execer, send []enqueueRow, sent []EnqueueResult) error {
	var keys []string
	for i, r := range sent {
		if r.ID == 0 && send[i].UniqueKey != nil {
			keys = append(keys, *send[i].UniqueKey)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	list, _ := json.Marshal(keys)
	found := make(map[string]int64, len(keys))
	err := ex.Query(ctx, sqlUniqueLookup, []any{string(list)}, func(row scanner) error {
		var key string
		var id int64
		if err := row.Scan(&key, &id); err != nil {
			return err
		}
		found[key] = id
		return nil
	})
	if err != nil {
		return fmt.Errorf("core: enqueue: read the ids of duplicates: %w", err)
	}
	for i, r := range sent {
		if r.ID != 0 || send[i].UniqueKey == nil {
			continue
		}
		id, ok := found[*send[i].UniqueKey]
		if !ok {
			return fmt.Errorf("core: enqueue: the job holding unique key %q left its unique states while this enqueue ran: that job was neither inserted nor found; enqueue it again", *send[i].UniqueKey)
		}
		sent[i].ID = id
	}
	return nil
}

// enqueueRow is one job as the enqueue statements read it.
type enqueueRow = jobinsert.Row

func prepareEnqueue(args JobArgs, opts *EnqueueOpts) (enqueueRow, error) {
	if args == nil {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: "nil JobArgs"}
	}
	kind := args.Kind()
	if err := validateKind(kind, args); err != nil {
		return enqueueRow{}, err
	}
	o := mergeOpts(args, opts)
	if err := validateName("queue", o.Queue, 128); err != nil {
		return enqueueRow{}, err
	}
	priority := 0
	if o.Priority != nil {
		priority = *o.Priority
	}
	if priority < 0 || priority > MaxPriority {
		return enqueueRow{}, &ValidationError{Field: "priority", Reason: fmt.Sprintf("%d is outside 0..%d", priority, MaxPriority)}
	}
	if o.Delay < 0 {
		return enqueueRow{}, &ValidationError{Field: "delay", Reason: fmt.Sprintf("%s is negative", o.Delay)}
	}
	if o.Delay > 0 && !o.RunAt.IsZero() {
		return enqueueRow{}, &ValidationError{Field: "run at", Reason: "RunAt and Delay are both set; choose one"}
	}
	if !o.RunAt.IsZero() {
		// PostgreSQL's timestamptz ends in 294276 AD and JSON's RFC 3339
		// has four-digit years: keep to years 1 through 9999.
		if y := o.RunAt.UTC().Year(); y < 1 || y > 9999 {
			return enqueueRow{}, &ValidationError{Field: "run at", Reason: fmt.Sprintf("year %d is outside 1..9999", y)}
		}
	}
	if o.MaxAttempts < 0 || o.MaxAttempts > MaxAttemptsLimit {
		return enqueueRow{}, &ValidationError{Field: "max attempts", Reason: fmt.Sprintf("%d is outside 1..%d (0 means the default)", o.MaxAttempts, MaxAttemptsLimit)}
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: fmt.Sprintf("encode %T: %v", args, err)}
	}
	if len(encoded) == 0 || encoded[0] != '{' {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: fmt.Sprintf("%T encodes to %.20s, not a JSON object", args, encoded)}
	}
	if hasJSONNul(encoded) {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: "a string holds a NUL character (\\u0000), which PostgreSQL's jsonb refuses"}
	}
	meta := json.RawMessage(`{}`)
	if len(o.Metadata) > 0 {
		if meta, err = json.Marshal(o.Metadata); err != nil {
			return enqueueRow{}, &ValidationError{Field: "metadata", Reason: err.Error()}
		}
		if hasJSONNul(meta) {
			return enqueueRow{}, &ValidationError{Field: "metadata", Reason: "a string holds a NUL character (\\u0000), which PostgreSQL's jsonb refuses"}
		}
	}
	tags, err := validateTags(o.Tags)
	if err != nil {
		return enqueueRow{}, err
	}
	r := enqueueRow{
		Kind:        kind,
		Queue:       o.Queue,
		Args:        encoded,
		Priority:    priority,
		MaxAttempts: o.MaxAttempts,
		DelayUS:     o.Delay.Microseconds(),
		Metadata:    meta,
		Tags:        tags,
	}
	if r.Queue == "" {
		r.Queue = DefaultQueue
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if !o.RunAt.IsZero() {
		t := o.RunAt
		r.RunAt = &t
	}
	if o.OrderingKey != "" {
		if err := validateName("ordering key", o.OrderingKey, 500); err != nil {
			return enqueueRow{}, err
		}
		k := o.OrderingKey
		r.OrderingKey = &k
	}
	if o.Unique != nil {
		key, states, err := uniqueKey(kind, encoded, o.Unique)
		if err != nil {
			return enqueueRow{}, err
		}
		r.UniqueKey, r.UniqueStates = &key, states
	}
	return r, nil
}

// uniqueKey renders a unique job's key, readable in the table:
// kind|key or kind|args:<sha256 of the encoded args>, then |period start.
func uniqueKey(kind string, args []byte, u *UniqueOpts) (string, []string, error) {
	key := u.Key
	if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
		return "", nil, &ValidationError{Field: "unique key", Reason: "must be valid UTF-8 without NUL bytes"}
	}
	if key == "" {
		sum := sha256.Sum256(args)
		key = "args:" + hex.EncodeToString(sum[:])
	}
	key = kind + "|" + key
	if u.Period < 0 {
		return "", nil, &ValidationError{Field: "unique period", Reason: fmt.Sprintf("%s is negative", u.Period)}
	}
	if u.Period > 0 {
		key += "|" + time.Now().UTC().Truncate(u.Period).Format(time.RFC3339Nano)
	}
	states := u.States
	if len(states) == 0 {
		states = []JobState{StateQueued, StateClaimed}
	}
	var out []string
	has := map[JobState]bool{}
	for _, s := range states {
		if !slices.Contains(States(), s) {
			return "", nil, &ValidationError{Field: "unique states", Reason: fmt.Sprintf("unknown state %q", s)}
		}
		if !has[s] {
			has[s] = true
			out = append(out, string(s))
		}
	}
	if !has[StateQueued] || !has[StateClaimed] {
		return "", nil, &ValidationError{Field: "unique states", Reason: "must include queued and claimed"}
	}
	return key, out, nil
}

// mergeOpts lays opts over the kind's defaults, field by field.
func mergeOpts(args JobArgs, opts *EnqueueOpts) EnqueueOpts {
	var o EnqueueOpts
	if d, ok := args.(JobArgsWithOpts); ok {
		o = d.EnqueueOpts()
	}
	if opts == nil {
		return o
	}
	if opts.Queue != "" {
		o.Queue = opts.Queue
	}
	if opts.Priority != nil {
		o.Priority = opts.Priority
	}
	if !opts.RunAt.IsZero() {
		o.RunAt = opts.RunAt
		o.Delay = 0
	}
	if opts.Delay != 0 {
		o.Delay = opts.Delay
		if opts.RunAt.IsZero() {
			o.RunAt = time.Time{}
		}
	}
	if opts.MaxAttempts != 0 {
		o.MaxAttempts = opts.MaxAttempts
	}
	if opts.Metadata != nil {
		o.Metadata = opts.Metadata
	}
	if opts.Unique != nil {
		o.Unique = opts.Unique
	}
	if opts.OrderingKey != "" {
		o.OrderingKey = opts.OrderingKey
	}
	if opts.Tags != nil {
		o.Tags = opts.Tags
	}
	return o
}
