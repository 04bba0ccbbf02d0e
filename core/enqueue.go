package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// DefaultQueue is the queue of jobs enqueued without one.
const DefaultQueue = "default"

// DefaultMaxAttempts is the number of attempts of a job enqueued without one.
const DefaultMaxAttempts = 25

// MaxPriority is the largest (least urgent) priority.
const MaxPriority = 32767

// EnqueueOpts tune one enqueue. The zero value (or nil) means: queue
// "default", priority 0, run now, 25 attempts, no metadata. Non-zero fields
// override the kind's defaults from JobArgsWithOpts.
type EnqueueOpts struct {
	// Queue names the queue; workers serve queues by name.
	Queue string
	// Priority orders runnable jobs within a queue: 0 runs first, larger
	// numbers later, up to MaxPriority.
	Priority int
	// RunAt makes the job runnable no earlier than this instant. Use Delay to
	// count from the database's clock instead of this process's.
	RunAt time.Time
	// Delay makes the job runnable this long after the database's now().
	Delay time.Duration
	// MaxAttempts is how many times the job may start before it is dead.
	MaxAttempts int
	// Metadata is stored with the job as a JSON object.
	Metadata map[string]any
}

// EnqueueParams is one job of a batch for EnqueueMany.
type EnqueueParams struct {
	Args JobArgs
	Opts *EnqueueOpts
}

// EnqueueResult says what an enqueue wrote.
type EnqueueResult struct {
	// ID is the new job's id.
	ID int64
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
func EnqueueMany(ctx context.Context, db DB, params []EnqueueParams) ([]EnqueueResult, error) {
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
	batch, err := json.Marshal(rows)
	if err != nil {
		return nil, fmt.Errorf("core: encode batch: %w", err)
	}
	results := make([]EnqueueResult, 0, len(params))
	err = ex.query(ctx, sqlEnqueue, []any{string(batch)}, func(row scanner) error {
		var r EnqueueResult
		if err := row.Scan(&r.ID); err != nil {
			return err
		}
		results = append(results, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("core: enqueue: %w", err)
	}
	if len(results) != len(params) {
		return nil, fmt.Errorf("core: enqueue: wrote %d of %d jobs", len(results), len(params))
	}
	return results, nil
}

// enqueueRow is one element of the JSON array sqlEnqueue reads.
type enqueueRow struct {
	Kind        string          `json:"kind"`
	Queue       string          `json:"queue"`
	Args        json.RawMessage `json:"args"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	RunAt       *time.Time      `json:"run_at,omitempty"`
	DelayUS     int64           `json:"delay_us"`
	Metadata    json.RawMessage `json:"metadata"`
}

func prepareEnqueue(args JobArgs, opts *EnqueueOpts) (enqueueRow, error) {
	if args == nil {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: "nil JobArgs"}
	}
	kind := args.Kind()
	if kind == "" {
		return enqueueRow{}, &ValidationError{Field: "kind", Reason: fmt.Sprintf("%T.Kind() returned an empty string", args)}
	}
	if len(kind) > 255 {
		return enqueueRow{}, &ValidationError{Field: "kind", Reason: "longer than 255 bytes"}
	}
	o := mergeOpts(args, opts)
	if len(o.Queue) > 128 {
		return enqueueRow{}, &ValidationError{Field: "queue", Reason: "longer than 128 bytes"}
	}
	if o.Priority < 0 || o.Priority > MaxPriority {
		return enqueueRow{}, &ValidationError{Field: "priority", Reason: fmt.Sprintf("%d is outside 0..%d", o.Priority, MaxPriority)}
	}
	if o.Delay < 0 {
		return enqueueRow{}, &ValidationError{Field: "delay", Reason: fmt.Sprintf("%s is negative", o.Delay)}
	}
	if o.Delay > 0 && !o.RunAt.IsZero() {
		return enqueueRow{}, &ValidationError{Field: "run at", Reason: "RunAt and Delay are both set; choose one"}
	}
	if o.MaxAttempts < 0 {
		return enqueueRow{}, &ValidationError{Field: "max attempts", Reason: fmt.Sprintf("%d is negative", o.MaxAttempts)}
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: fmt.Sprintf("encode %T: %v", args, err)}
	}
	if len(encoded) == 0 || encoded[0] != '{' {
		return enqueueRow{}, &ValidationError{Field: "args", Reason: fmt.Sprintf("%T encodes to %.20s, not a JSON object", args, encoded)}
	}
	meta := json.RawMessage(`{}`)
	if len(o.Metadata) > 0 {
		if meta, err = json.Marshal(o.Metadata); err != nil {
			return enqueueRow{}, &ValidationError{Field: "metadata", Reason: err.Error()}
		}
	}
	r := enqueueRow{
		Kind:        kind,
		Queue:       o.Queue,
		Args:        encoded,
		Priority:    o.Priority,
		MaxAttempts: o.MaxAttempts,
		DelayUS:     o.Delay.Microseconds(),
		Metadata:    meta,
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
	return r, nil
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
	if opts.Priority != 0 {
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
	return o
}
