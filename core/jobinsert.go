package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/relayq/relay/internal/jobinsert"
)

// The core's side of internal/jobinsert: the workflow layer inserts a
// run's job in the statement that inserts the run.
func init() {
	jobinsert.Prepare = prepareJobInsert
	jobinsert.SQL = jobInsertSQL
	jobinsert.SQLAfter = func(from, idCol string, param int) string {
		return notifyAfter(jobInsertSQL(from, idCol, param))
	}
}

// prepareJobInsert is Enqueue up to the statement, for one job without a
// unique key: validation, the producer span and its trace metadata.
func prepareJobInsert(ctx context.Context, a, o any) (jobinsert.Job, error) {
	args, ok := a.(JobArgs)
	if !ok {
		return jobinsert.Job{}, fmt.Errorf("core: job insert: %T is not a JobArgs", a)
	}
	opts, _ := o.(*EnqueueOpts)
	row, err := prepareEnqueue(args, opts)
	if err != nil {
		return jobinsert.Job{}, err
	}
	if row.UniqueKey != nil {
		return jobinsert.Job{}, errors.New("core: job insert: unique jobs go through Enqueue")
	}
	ctx, span, tc := startEnqueueSpan(ctx, nil, row.Queue, 1)
	if tc != nil {
		if row.Metadata, err = withTraceMetadata(row.Metadata, tc); err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			return jobinsert.Job{}, fmt.Errorf("core: enqueue: trace metadata: %w", err)
		}
	}
	rows := []enqueueRow{row}
	done := func(id int64, err error) {
		defer span.End()
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return
		}
		if id == 0 {
			return // not inserted: nothing sent, nothing counted
		}
		span.SetAttributes(attribute.String("messaging.message.id", strconv.FormatInt(id, 10)))
		countEnqueued(ctx, nil, rows, []EnqueueResult{{ID: id}})
	}
	wake := func(ctx context.Context, db any) {
		ex, err := execerFor(db)
		if err != nil {
			return
		}
		notifyQueues(ctx, db, ex, rows, []EnqueueResult{{}}, enqueueWakeCoalesce)
	}
	return jobinsert.Job{Ctx: ctx, Row: string(appendBatch(nil, rows)), Done: done, Wake: wake}, nil
}

// jobInsertSQL is sqlEnqueue inserting the job with the id from.idCol,
// once per row of from, reading the job from parameter $param.
func jobInsertSQL(from, idCol string, param int) string {
	s := mustReplace(sqlEnqueue, "INSERT INTO relay_jobs (kind,", "INSERT INTO relay_jobs (id, kind,")
	s = mustReplace(s, "SELECT j.kind,", "SELECT "+from+"."+idCol+", j.kind,")
	s = mustReplace(s, "jsonb_to_recordset($1::jsonb)", "jsonb_to_recordset($"+strconv.Itoa(param)+"::jsonb)")
	s = mustReplace(s, "FROM ROWS FROM", "FROM "+from+", ROWS FROM")
	return mustReplace(s, "RETURNING id, false", "RETURNING id")
}
