package jobinsert

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/dbx"
)

// One is a job that another layer inserts inside a statement of its own
// (SQLInto), as core's Enqueue would: under a producer span, counted once
// inserted, its queue woken after the commit.
type One struct {
	// Ctx carries the job's producer span: run the statement under it.
	Ctx  context.Context
	rows []Row
	span trace.Span
	ctr  metric.Int64Counter // nil: the global meter's
}

// Begin starts the producer span of row (with the global tracer provider,
// as core.Enqueue) and stores its trace context in the row's metadata.
// Call Done once the statement ran. A unique job is refused: its
// duplicate check is core's Enqueue's.
func Begin(ctx context.Context, row Row) (*One, error) {
	return BeginFor(ctx, row, nil, nil)
}

// BeginFor is Begin with a client's tracer provider and relay.jobs.enqueued
// counter (nil for the global ones), as a core Client's own enqueues use:
// for a job inserted claimed by that client (eager.Lent).
func BeginFor(ctx context.Context, row Row, tp trace.TracerProvider, ctr metric.Int64Counter) (*One, error) {
	if row.UniqueKey != nil {
		return nil, errors.New("core: job insert: unique jobs go through Enqueue")
	}
	ctx, span, tc := StartSpan(ctx, tp, row.Queue, 1)
	if tc != nil {
		var err error
		if row.Metadata, err = WithTraceMetadata(row.Metadata, tc); err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			return nil, fmt.Errorf("core: enqueue: trace metadata: %w", err)
		}
	}
	return &One{Ctx: ctx, rows: []Row{row}, span: span, ctr: ctr}, nil
}

// Row is the job as inserted: the row Begin was given, its trace context
// in its metadata.
func (o *One) Row() Row { return o.rows[0] }

// Param is the job as SQLInto's parameter reads it.
func (o *One) Param() string { return string(AppendBatch(nil, o.rows)) }

// Done ends the producer span and counts the job once the statement ran:
// id is the job's id (0: the statement inserted none), err the
// statement's error.
func (o *One) Done(id int64, err error) {
	defer o.span.End()
	if err != nil {
		o.span.RecordError(err)
		o.span.SetStatus(codes.Error, err.Error())
		return
	}
	if id == 0 {
		return // not inserted: nothing sent, nothing counted
	}
	o.span.SetAttributes(attribute.String("messaging.message.id", strconv.FormatInt(id, 10)))
	Count(o.Ctx, o.ctr, o.rows, func(int) bool { return true })
}

// Wake wakes the workers of the job's queue (unless the job runs later)
// after a NotifyAfter statement inserted it and committed, on db, the
// handle it ran on: as core.Enqueue does for an enqueue that is its own
// transaction.
func (o *One) Wake(ctx context.Context, db any) {
	ex, err := dbx.For(db)
	if err != nil {
		return
	}
	Wake(ctx, db, ex, QueuesToWake(o.rows, func(int) bool { return true }), DefaultWakeWindow)
}
