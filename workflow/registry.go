package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/eager"
)

// Config configures a Registry. The zero value is usable.
type Config struct {
	// TracerProvider makes the executions' and steps' spans. Default: the
	// global one.
	TracerProvider trace.TracerProvider
	// Logger receives the registry's logs. Default slog.Default().
	Logger *slog.Logger
	// ExecutionRetry is the delay after an execution that failed or crashed
	// (not a step's retry: see StepOpts). Default core.Backoff{Base: time.Second, Max: time.Minute}.
	ExecutionRetry core.RetryPolicy
}

// Registry holds the workflows a process knows, and executes their runs
// when its workers are added to a core.Client (AddWorkers). Register every
// workflow before the client starts.
type Registry struct {
	pool   *pgxpool.Pool
	cfg    Config
	logger *slog.Logger
	tracer trace.Tracer
	byName map[string]*definition
	stats  stats
	// histories keeps the histories of runs this registry suspended.
	histories histCache
	waiter    waiter
	// announcer wakes Result callers after a run's end commits, and
	// UpdateResult callers after an update's answer commits.
	announcer announcer
	// updatePoll, when set (tests), replaces updatePollFallback.
	updatePoll time.Duration
	// group sends the checkpoints of concurrent executions together.
	group grouper
	// errs and types are the errors declared with DeclareError and
	// DeclareErrorType, in declaration order.
	errs  []declaredError
	types []declaredType
	// eager holds the eager inserter of each core.Client made with this
	// registry's workers (runWorker.AttachEager), by client: RunNow
	// inserts its runs' jobs claimed through it.
	eagerMu sync.Mutex
	eager   map[any]eagerInserter
}

// eagerInserter is a core.Client's eager inserter.
type eagerInserter = eager.Inserter[core.JobArgs, *core.EnqueueOpts, *core.JobRow]

// Stats counts what a registry's executions did since it was made.
type Stats struct {
	Executions int64 // executions started
	Replayed   int64 // steps answered from history
	Checkpoint int64 // checkpoints committed
	// LateCheckpointsRefused counts checkpoints refused because the
	// execution's attempt had lost the run's lease (it was rescued while
	// this execution was paused, partitioned or slow).
	LateCheckpointsRefused int64
	Suspended              int64 // executions that ended suspended
	Finished               int64 // runs this registry finished
	// HistoryRead counts the history steps executions read from the
	// database. A run executed again by the registry that suspended it
	// rereads only the steps that may have changed since.
	HistoryRead int64
}

type stats struct {
	executions, replayed, checkpoints, refused, suspended, finished, historyRead atomic.Int64
}

// definition is one registered workflow with its types erased.
type definition struct {
	name string
	// call decodes the input, calls the function and encodes its output.
	call func(wctx Context, input []byte) ([]byte, error)
}

// Workflow is a registered workflow, typed by its input and output. Pass it
// to Start and Child.
type Workflow[In, Out any] struct {
	name string
	reg  *Registry
}

// Name is the name the workflow was registered under.
func (w *Workflow[In, Out]) Name() string { return w.name }

// Close stops the registry's LISTEN connection for Handle.Result, Results,
// Update and UpdateResult callers, which otherwise closes 10 s after the
// last caller stopped waiting: call it before closing the pool, or the
// connection's loss is logged as it reconnects. They poll afterwards.
// Executions are the core.Client's, and stop with it.
func (r *Registry) Close() {
	r.waiter.close()
}

// NewRegistry returns an empty registry whose executions write through pool
// (which must not be nil to execute runs).
func NewRegistry(pool *pgxpool.Pool, cfg *Config) *Registry {
	r := &Registry{pool: pool, byName: map[string]*definition{}, errs: builtinErrors()}
	r.waiter.r = r
	if cfg != nil {
		r.cfg = *cfg
	}
	r.logger = cmp.Or(r.cfg.Logger, slog.Default())
	tp := r.cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	r.tracer = tp.Tracer(instrumentationName)
	if r.cfg.ExecutionRetry == nil {
		r.cfg.ExecutionRetry = core.Backoff{Base: time.Second, Max: time.Minute}
	}
	return r
}

// Register adds the workflow fn under name. The name is stored with every
// run, so it must stay stable when the Go function is renamed. In and Out are
// inferred from fn and encoded with encoding/json. Registering a name twice
// is an error.
func Register[In, Out any](r *Registry, name string, fn func(wctx Context, in In) (Out, error)) (*Workflow[In, Out], error) {
	if r == nil {
		return nil, errors.New("workflow: register: nil registry")
	}
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("workflow: register: name %q must be 1 to 255 bytes", name)
	}
	if fn == nil {
		return nil, fmt.Errorf("workflow: register %q: nil function", name)
	}
	if _, dup := r.byName[name]; dup {
		return nil, fmt.Errorf("workflow: register: %q is already registered", name)
	}
	r.byName[name] = &definition{
		name: name,
		call: func(wctx Context, input []byte) ([]byte, error) {
			var in In
			if err := json.Unmarshal(input, &in); err != nil {
				return nil, &fatalError{fmt.Errorf("workflow: decode input of %s run %s into %T: %w", name, wctx.RunID(), in, err)}
			}
			out, err := fn(wctx, in)
			if err != nil {
				return nil, err
			}
			enc, err := encode("output", out)
			if err != nil {
				return nil, &fatalError{fmt.Errorf("workflow: %s run %s: %w", name, wctx.RunID(), err)}
			}
			return enc, nil
		},
	}
	return &Workflow[In, Out]{name: name, reg: r}, nil
}

// MustRegister is Register that panics on error, for start-up.
func MustRegister[In, Out any](r *Registry, name string, fn func(wctx Context, in In) (Out, error)) *Workflow[In, Out] {
	w, err := Register(r, name, fn)
	if err != nil {
		panic(err)
	}
	return w
}

// Registered reports whether a workflow of that name is registered.
func (r *Registry) Registered(name string) bool { _, ok := r.byName[name]; return ok }

// Stats returns the registry's counters.
func (r *Registry) Stats() Stats {
	s := &r.stats
	return Stats{
		Executions: s.executions.Load(), Replayed: s.replayed.Load(), Checkpoint: s.checkpoints.Load(),
		LateCheckpointsRefused: s.refused.Load(), Suspended: s.suspended.Load(), Finished: s.finished.Load(),
		HistoryRead: s.historyRead.Load(),
	}
}

// RunKind is the core job kind that executes runs.
const RunKind = "relay.workflow"

// runArgs are the args of a run's job.
type runArgs struct {
	RunID string `json:"run_id"`
}

func (runArgs) Kind() string { return RunKind }

// metaRunID is the metadata key of a run's job that names the run: the
// core reads it (by this name) to put the run's id in its log lines about
// the job (a rescue, a lost lease), with no query of its own.
const metaRunID = "relay.run_id"

// runJobMetadata is the metadata of run id's job: the run's id and the
// trace context in carrier.
func runJobMetadata[V any](id string, carrier map[string]V) map[string]any {
	meta := make(map[string]any, len(carrier)+1)
	for k, v := range carrier {
		meta[k] = v
	}
	meta[metaRunID] = id
	return meta
}

// runWorker executes runs: a core.Worker of RunKind.
type runWorker struct{ r *Registry }

func (w runWorker) Work(ctx context.Context, job *core.Job[runArgs]) error {
	return w.r.execute(ctx, job)
}

// AttachEager implements eager.Attacher: core.NewClient hands over the
// inserter of each client made with the registry's workers.
func (w runWorker) AttachEager(client any, ins eagerInserter) {
	w.r.eagerMu.Lock()
	defer w.r.eagerMu.Unlock()
	if w.r.eager == nil {
		w.r.eager = map[any]eagerInserter{}
	}
	w.r.eager[client] = ins
}

// eagerFor is the eager inserter of c, if c was made with the registry's
// workers.
func (r *Registry) eagerFor(c *core.Client) (eagerInserter, bool) {
	r.eagerMu.Lock()
	defer r.eagerMu.Unlock()
	ins, ok := r.eager[c]
	return ins, ok
}

// eagerInserters are the eager inserters of the clients made with the
// registry's workers.
func (r *Registry) eagerInserters() []eagerInserter {
	r.eagerMu.Lock()
	defer r.eagerMu.Unlock()
	out := make([]eagerInserter, 0, len(r.eager))
	for _, ins := range r.eager {
		out = append(out, ins)
	}
	return out
}

// RetryDelay is the delay after a failed or crashed execution.
func (w runWorker) RetryDelay(attempt int, err error) time.Duration {
	return w.r.cfg.ExecutionRetry.RetryDelay(attempt, err)
}

// AddWorkers registers the registry's job kinds with ws: RunKind, which
// executes runs, and StartKind, which starts a run from a job (the
// scheduler's and the outbox's hook). A core.Client with ws then executes
// runs on the queues it serves; start runs on those queues (StartOpts.Queue).
func (r *Registry) AddWorkers(ws *core.Workers) error {
	if r.pool == nil {
		return errors.New("workflow: add workers: the registry has no pool (NewRegistry(nil, ...))")
	}
	if err := core.AddWorker[runArgs](ws, runWorker{r}); err != nil {
		return fmt.Errorf("workflow: add workers: %w", err)
	}
	if err := core.AddWorker[StartArgs](ws, startWorker{r}); err != nil {
		return fmt.Errorf("workflow: add workers: %w", err)
	}
	return nil
}

// encode encodes v as JSON within MaxPayloadBytes; what names v in errors.
func encode(what string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("workflow: encode %s (%T): %w", what, v, err)
	}
	if len(b) > MaxPayloadBytes {
		return nil, fmt.Errorf("%w: %s encodes to %d bytes, over the %d-byte limit", ErrTooLarge, what, len(b), MaxPayloadBytes)
	}
	return b, nil
}
