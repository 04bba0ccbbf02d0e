package core

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// JobArgs is the payload of a job. Kind names the job's type; it is stored
// with the job and picks its worker, so it must stay stable when the Go type
// is renamed. Args are encoded with encoding/json.
type JobArgs interface {
	Kind() string
}

// JobArgsWithOpts is implemented by job args that carry default enqueue
// options for their kind (a queue, a priority, a number of attempts). Options
// given to Enqueue override them field by field.
type JobArgsWithOpts interface {
	JobArgs
	EnqueueOpts() EnqueueOpts
}

// JobState is a job's place in the state machine.
type JobState string

const (
	// StateQueued jobs wait for RunAt, then for a worker.
	StateQueued JobState = "queued"
	// StateClaimed jobs are leased to a worker that is running them.
	StateClaimed JobState = "claimed"
	// StateSucceeded jobs are done.
	StateSucceeded JobState = "succeeded"
	// StateDead jobs failed permanently or ran out of attempts. Requeue
	// brings one back.
	StateDead JobState = "dead"
	// StateCancelled jobs were cancelled before they succeeded.
	StateCancelled JobState = "cancelled"
)

// Final reports whether no worker will touch a job in this state again
// (unless it is requeued).
func (s JobState) Final() bool {
	return s == StateSucceeded || s == StateDead || s == StateCancelled
}

// JobRow is a job as stored, without decoding its args.
type JobRow struct {
	ID          int64
	Kind        string
	Queue       string
	State       JobState
	Priority    int
	Attempt     int // executions started, this one included
	MaxAttempts int
	RunAt       time.Time
	CreatedAt   time.Time
	AttemptedAt time.Time
	AttemptedBy string
	FinalizedAt *time.Time
	LastError   string
	// EncodedArgs is the job's args as stored (JSON).
	EncodedArgs json.RawMessage
	// Metadata is the job's free-form metadata (JSON object).
	Metadata json.RawMessage
	// History holds one entry per attempt that did not succeed.
	History []AttemptRecord
	// OrderingKey is the job's ordering key ("" for none).
	OrderingKey string
	// Tags are the job's tags (EnqueueOpts.Tags), nil for none.
	Tags []string
	// LeaseToken fences this attempt's writes. Zero outside a worker.
	LeaseToken uuid.UUID

	// completedInTx is set by CompleteTx, telling the executor that success
	// was recorded in the handler's own transaction.
	completedInTx bool
	// undecodable, when set, is why the claimed row cannot run (see
	// ErrUndecodableJob): the attempt fails with it instead of running.
	undecodable error
	// run is the attempt running this job in a client (nil elsewhere).
	run *running
}

// AttemptRecord is one failed or interrupted attempt.
type AttemptRecord struct {
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Error      string    `json:"error"`
	Worker     string    `json:"worker"`
	// RetryIn is the delay this failure set before the next attempt (the
	// handler's RetryIn, else the retry policy's backoff). Zero when the
	// failure ended the job, and for attempts that ended otherwise (a
	// rescued lease, a shutdown). Stored as retry_in_us, in microseconds.
	RetryIn time.Duration `json:"-"`
}

// attemptRecordJSON is AttemptRecord as stored in a job's history.
type attemptRecordJSON struct {
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Error      string    `json:"error"`
	Worker     string    `json:"worker"`
	RetryInUS  int64     `json:"retry_in_us,omitempty"`
}

// UnmarshalJSON reads a history entry as stored.
func (r *AttemptRecord) UnmarshalJSON(b []byte) error {
	var v attemptRecordJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = AttemptRecord{Attempt: v.Attempt, StartedAt: v.StartedAt, FinishedAt: v.FinishedAt, Error: v.Error,
		Worker: v.Worker, RetryIn: time.Duration(v.RetryInUS) * time.Microsecond}
	return nil
}

// MarshalJSON writes a history entry as it is stored.
func (r AttemptRecord) MarshalJSON() ([]byte, error) {
	return json.Marshal(attemptRecordJSON{Attempt: r.Attempt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		Error: r.Error, Worker: r.Worker, RetryInUS: r.RetryIn.Microseconds()})
}

// Job is a job with its args decoded, as handed to a Worker.
type Job[T JobArgs] struct {
	*JobRow
	Args T
}
