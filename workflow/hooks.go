package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
)

// StartKind is the core job kind that starts a run: the hook by which the
// scheduler (a schedule whose Args are StartArgs) and the outbox (a
// subscription of Kind StartKind with StartMetadata) start workflows.
const StartKind = "relay.workflow.start"

// MetaWorkflowName is the job metadata key naming the workflow a StartKind
// job starts when its args do not (an outbox delivery). Its value is not
// RunKind's: one is a metadata key, the other a job kind.
const MetaWorkflowName = "relay.workflow_name"

// StartArgs are the args of a StartKind job. The run's id is ID, or
// "<workflow>-job-<job id>" so that the job's retries start one run.
//
// An outbox delivery enqueued as a StartKind job carries no Workflow: the
// workflow is named by the job's metadata (StartMetadata), its input is the
// event's payload and the run's id "<workflow>-event-<event id>".
type StartArgs struct {
	Workflow string          `json:"workflow,omitempty"`
	Input    json.RawMessage `json:"input,omitempty"`
	ID       string          `json:"id,omitempty"`
	Queue    string          `json:"queue,omitempty"`
	// FireTimeKey, on a schedule's StartArgs, derives the run from the
	// fire (the job's "relay.schedule" and "relay.fire_time" metadata):
	// the input, a JSON object (or none), gets the fire time (RFC 3339,
	// UTC) under this key, and the run's id, unless ID is set, is
	// "<workflow>:<schedule>:<fire time>", so a fire started twice starts
	// one run. Ignored on a job that carries no fire time.
	FireTimeKey string `json:"fire_time_key,omitempty"`
	// The outbox's delivery fields (outbox.Delivery).
	EventID int64           `json:"event_id,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Kind implements core.JobArgs.
func (StartArgs) Kind() string { return StartKind }

// StartMetadata is the job metadata that makes a StartKind job without a
// workflow in its args (an outbox subscription's) start workflow name.
func StartMetadata(name string) map[string]any { return map[string]any{MetaWorkflowName: name} }

// unregisteredGrace is how long a start job naming a workflow this process
// does not know is put back for another process before it dies.
const unregisteredGrace = time.Hour

// startWorker starts runs from StartKind jobs, in the job's completion
// transaction: the run exists exactly once whatever the job's retries.
type startWorker struct{ r *Registry }

func (w startWorker) Work(ctx context.Context, job *core.Job[StartArgs]) error {
	a := job.Args
	name, input, id := a.Workflow, a.Input, a.ID
	if name == "" {
		var meta map[string]any
		json.Unmarshal(job.Metadata, &meta) //nolint:errcheck // checked below
		name, _ = meta[MetaWorkflowName].(string)
		input = a.Payload
		if id == "" && a.EventID != 0 {
			id = name + "-event-" + strconv.FormatInt(a.EventID, 10)
		}
	}
	if name == "" {
		return core.Permanent(fmt.Errorf("workflow: start job %d names no workflow (args or metadata %q)", job.ID, MetaWorkflowName))
	}
	if !w.r.Registered(name) {
		err := fmt.Errorf("%w: %q (start job %d)", ErrUnregistered, name, job.ID)
		if time.Since(job.CreatedAt) < unregisteredGrace {
			// A rolling deploy: newer code enqueued this start. Put it
			// back, without spending an attempt, for a process that knows
			// the workflow; a name no process knows dies once the job is old.
			attrs := []any{"job_id", job.ID, "workflow", name, "retry_in", unregisteredDelay}
			if id != "" {
				attrs = append([]any{"run_id", id}, attrs...) // the run it is to start (its id derived from a fire comes later)
			}
			w.r.logger.Warn("relay: start job of a workflow not registered in this process; put back for another process", attrs...)
			return core.Snooze(unregisteredDelay)
		}
		return core.Permanent(err)
	}
	if a.Workflow != "" && a.FireTimeKey != "" {
		var err error
		if input, id, err = fromFire(job.Metadata, name, a.FireTimeKey, input, id); err != nil {
			return core.Permanent(fmt.Errorf("workflow: start job %d: %w", job.ID, err))
		}
	}
	id = cmp.Or(id, name+"-job-"+strconv.FormatInt(job.ID, 10))
	err := pgx.BeginFunc(ctx, w.r.pool, func(tx pgx.Tx) error {
		if _, _, err := StartNamed(ctx, tx, w.r, name, input, &StartOpts{ID: id, Queue: a.Queue}); err != nil {
			return err
		}
		return core.CompleteTx(ctx, tx, job)
	})
	if errors.Is(err, ErrIDInUse) || errors.Is(err, ErrTooLarge) || errors.Is(err, errInvalidInput) {
		return core.Permanent(err) // the same on every retry
	}
	return err
}

// Metadata keys the scheduler sets on a fire's job (scheduler.MetaSchedule,
// scheduler.MetaFireTime), read here without importing the scheduler.
const (
	metaSchedule = "relay.schedule"
	metaFireTime = "relay.fire_time"
)

// fromFire puts a schedule fire's time into input under key and derives the
// run id from it (when id is ""). A job without a fire time is left as is.
func fromFire(metadata []byte, name, key string, input json.RawMessage, id string) (json.RawMessage, string, error) {
	var meta map[string]any
	json.Unmarshal(metadata, &meta) //nolint:errcheck // no fire time then
	fired, _ := meta[metaFireTime].(string)
	if fired == "" {
		return input, id, nil
	}
	obj := map[string]json.RawMessage{}
	if len(input) > 0 && string(input) != "null" {
		if err := json.Unmarshal(input, &obj); err != nil {
			return nil, "", fmt.Errorf("input with FireTimeKey %q is not a JSON object: %w", key, err)
		}
	}
	obj[key], _ = json.Marshal(fired)
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, "", fmt.Errorf("input with fire time: %w", err)
	}
	if id == "" {
		schedule, _ := meta[metaSchedule].(string)
		id = name + ":" + schedule + ":" + fired
	}
	return out, id, nil
}
