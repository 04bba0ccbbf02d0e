package scheduler

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/relayq/relay/core"
)

// Schedule declares one recurring job. Name, Spec and Args are required; the
// zero value of every other field is a sensible default.
type Schedule struct {
	// Name identifies the schedule across processes and deploys; fires are
	// recorded under it.
	Name string
	// Spec says when it fires: cron syntax, see Spec.
	Spec string
	// TimeZone is the IANA zone ("Europe/Paris") the spec's wall-clock
	// fields are read in. Empty means UTC, or the spec's CRON_TZ= prefix.
	TimeZone string
	// Args is the job each fire enqueues; its Kind picks the worker.
	Args core.JobArgs
	// Opts are the job's enqueue options. RunAt and Delay must be unset: the
	// fire time decides when the job runs.
	Opts *core.EnqueueOpts
	// CatchUp says what to do about fires missed while no scheduler ran.
	// Default CatchUpLatest.
	CatchUp CatchUp
	// CatchUpLimit bounds CatchUpAll: at most this many of the latest missed
	// fires are enqueued. Default 100.
	CatchUpLimit int
	// Overlap says whether a fire may enqueue while this schedule's previous
	// job is still queued or running. Default OverlapAllow.
	Overlap Overlap
}

// CatchUp is a policy for missed fires: fires more than Config.MisfireGrace
// old when a scheduler reaches them, because every scheduler process was
// down (or the database was unreachable). Fires reached within the grace are
// on time and always enqueued.
type CatchUp int

const (
	// CatchUpLatest enqueues one job for the latest missed fire.
	CatchUpLatest CatchUp = iota
	// CatchUpSkip enqueues nothing for missed fires.
	CatchUpSkip
	// CatchUpAll enqueues every missed fire, up to CatchUpLimit of the latest.
	CatchUpAll
)

var catchUpNames = map[CatchUp]string{CatchUpLatest: "latest", CatchUpSkip: "skip", CatchUpAll: "all"}

func (c CatchUp) String() string {
	if s, ok := catchUpNames[c]; ok {
		return s
	}
	return fmt.Sprintf("CatchUp(%d)", int(c))
}

// Overlap is a policy for a fire that comes while the schedule's previous job
// has not finished.
type Overlap int

const (
	// OverlapAllow enqueues every fire.
	OverlapAllow Overlap = iota
	// OverlapSkip records the fire as skipped when the previous job is still
	// queued or running.
	OverlapSkip
)

var overlapNames = map[Overlap]string{OverlapAllow: "allow", OverlapSkip: "skip"}

func (o Overlap) String() string {
	if s, ok := overlapNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Overlap(%d)", int(o))
}

// DefaultCatchUpLimit bounds CatchUpAll when CatchUpLimit is zero.
const DefaultCatchUpLimit = 100

// Metadata keys set on every job a schedule enqueues.
const (
	MetaSchedule = "relay.schedule"
	MetaFireTime = "relay.fire_time"
)

// declared is a validated Schedule in the shape of its table row.
type declared struct {
	name, spec, timezone string
	parsed               *Spec
	kind                 string
	args                 json.RawMessage
	queue                string
	priority             int
	maxAttempts          int
	metadata             json.RawMessage
	catchUp              string
	catchUpLimit         int
	overlap              string
}

// validate checks a Schedule and renders it as a row. Errors name the
// schedule.
func (s Schedule) validate() (*declared, error) {
	fail := func(format string, a ...any) (*declared, error) {
		return nil, fmt.Errorf("scheduler: schedule %q: %s", s.Name, fmt.Sprintf(format, a...))
	}
	if s.Name == "" || len(s.Name) > 200 {
		return fail("name must be 1 to 200 bytes")
	}
	var loc *time.Location
	if s.TimeZone != "" {
		l, err := time.LoadLocation(s.TimeZone)
		if err != nil {
			return fail("time zone %q: %v", s.TimeZone, err)
		}
		loc = l
	}
	parsed, err := ParseSpec(s.Spec, loc)
	if err != nil {
		return fail("%v", err)
	}
	if loc != nil && parsed.Location().String() != loc.String() {
		return fail("time zone given twice: TimeZone %q and %s in the spec", s.TimeZone, parsed.Location())
	}
	if s.Args == nil || s.Args.Kind() == "" {
		return fail("Args must be set and have a kind")
	}
	args, err := json.Marshal(s.Args)
	if err != nil || len(args) == 0 || args[0] != '{' {
		return fail("args %T must encode to a JSON object (err: %v)", s.Args, err)
	}
	o := core.EnqueueOpts{}
	if d, ok := s.Args.(core.JobArgsWithOpts); ok {
		o = d.EnqueueOpts()
	}
	if s.Opts != nil {
		if !s.Opts.RunAt.IsZero() || s.Opts.Delay != 0 {
			return fail("Opts.RunAt and Opts.Delay must be unset; the fire time decides when the job runs")
		}
		if s.Opts.Queue != "" {
			o.Queue = s.Opts.Queue
		}
		if s.Opts.Priority != nil {
			o.Priority = s.Opts.Priority
		}
		if s.Opts.MaxAttempts != 0 {
			o.MaxAttempts = s.Opts.MaxAttempts
		}
		if s.Opts.Metadata != nil {
			o.Metadata = s.Opts.Metadata
		}
	}
	if o.Queue == "" {
		o.Queue = core.DefaultQueue
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = core.DefaultMaxAttempts
	}
	priority := 0
	if o.Priority != nil {
		priority = *o.Priority
	}
	if priority < 0 || priority > core.MaxPriority || o.MaxAttempts < 0 || o.MaxAttempts > core.MaxAttemptsLimit {
		return fail("priority %d or max attempts %d out of range", priority, o.MaxAttempts)
	}
	meta := json.RawMessage(`{}`)
	if len(o.Metadata) > 0 {
		if meta, err = json.Marshal(o.Metadata); err != nil {
			return fail("metadata: %v", err)
		}
	}
	catchUp, ok := catchUpNames[s.CatchUp]
	if !ok {
		return fail("unknown catch-up policy %d", int(s.CatchUp))
	}
	overlap, ok := overlapNames[s.Overlap]
	if !ok {
		return fail("unknown overlap policy %d", int(s.Overlap))
	}
	limit := s.CatchUpLimit
	if limit < 0 {
		return fail("CatchUpLimit %d is negative", limit)
	}
	if limit == 0 {
		limit = DefaultCatchUpLimit
	}
	return &declared{
		name: s.Name, spec: s.Spec, timezone: parsed.Location().String(), parsed: parsed,
		kind: s.Args.Kind(), args: args, queue: o.Queue, priority: priority, maxAttempts: o.MaxAttempts,
		metadata: meta, catchUp: catchUp, catchUpLimit: limit, overlap: overlap,
	}, nil
}

// storedArgs is a job's kind and encoded args as a schedule row holds them,
// enqueued without knowing their Go type.
type storedArgs struct {
	kind string
	args json.RawMessage
}

func (a storedArgs) Kind() string                 { return a.kind }
func (a storedArgs) MarshalJSON() ([]byte, error) { return a.args, nil }
