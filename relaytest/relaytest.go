// Package relaytest helps test code that uses Relay: assert that a job was
// enqueued (in the test's transaction, typically), and run one job's
// worker without a client.
//
//	func TestCheckout(t *testing.T) {
//		tx := beginTx(t) // rolled back at the end
//		checkout(ctx, tx, order)
//		job := relaytest.RequireEnqueued[ReceiptArgs](ctx, t, tx, &relaytest.RequireOpts{Queue: "email"})
//		if job.Args.OrderID != order.ID { … }
//
//		err := relaytest.Work(ctx, t, &ReceiptWorker{…}, job.Args, nil)
//		…
//	}
//
// The helpers read and write through any handle core accepts (core.DB): a
// pgx, bun or database/sql transaction, connection or pool.
package relaytest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/relayq/relay/core"
)

// RequireOpts narrow which jobs count for RequireEnqueued and
// RequireNotEnqueued. The zero value (or nil) matches every job of the
// kind, in any state.
type RequireOpts struct {
	// Queue, when set, must be the job's queue.
	Queue string
	// Priority, when set, must be the job's priority.
	Priority *int
	// MaxAttempts, when set, must be the job's.
	MaxAttempts int
	// States, when set, must include the job's state.
	States []core.JobState
	// Tags, when set, must all be among the job's tags.
	Tags []string
	// Count, when set, is how many matching jobs there must be (for
	// RequireEnqueued; default: at least one).
	Count int
}

// maxScan bounds how many jobs of a kind a Require call reads.
const maxScan = 10000

// RequireEnqueued fails t unless db holds a job of T's kind matching opts,
// and returns the newest such job with its args decoded. Given the
// transaction the code under test enqueued in, it sees the job before (and
// without) a commit.
func RequireEnqueued[T core.JobArgs](ctx context.Context, t testing.TB, db core.DB, opts *RequireOpts) *core.Job[T] {
	t.Helper()
	var zero T
	kind := zero.Kind()
	matched, all := find(ctx, t, db, kind, opts)
	if len(matched) == 0 {
		t.Fatalf("relaytest: no %q job enqueued matching %s; found %d of the kind%s", kind, describe(opts), len(all), summary(all))
		return nil
	}
	if opts != nil && opts.Count > 0 && len(matched) != opts.Count {
		t.Fatalf("relaytest: %d %q jobs enqueued matching %s, want %d%s", len(matched), kind, describe(opts), opts.Count, summary(matched))
		return nil
	}
	job := &core.Job[T]{JobRow: matched[0]}
	if err := json.Unmarshal(matched[0].EncodedArgs, &job.Args); err != nil {
		t.Fatalf("relaytest: decode args of %q job %d into %T: %v", kind, matched[0].ID, job.Args, err)
		return nil
	}
	return job
}

// RequireNotEnqueued fails t if db holds a job of T's kind matching opts.
func RequireNotEnqueued[T core.JobArgs](ctx context.Context, t testing.TB, db core.DB, opts *RequireOpts) {
	t.Helper()
	var zero T
	kind := zero.Kind()
	if matched, _ := find(ctx, t, db, kind, opts); len(matched) > 0 {
		t.Fatalf("relaytest: %d %q jobs enqueued matching %s, want none%s", len(matched), kind, describe(opts), summary(matched))
	}
}

// find returns the jobs of kind matching opts, newest first, and all the
// jobs of the kind read.
func find(ctx context.Context, t testing.TB, db core.DB, kind string, opts *RequireOpts) (matched, all []*core.JobRow) {
	t.Helper()
	if opts == nil {
		opts = &RequireOpts{}
	}
	all, err := core.JobList(ctx, db, &core.JobListParams{Kinds: []string{kind}, Limit: maxScan})
	if err != nil {
		t.Fatalf("relaytest: list %q jobs: %v", kind, err)
	}
	for _, j := range all {
		switch {
		case opts.Queue != "" && j.Queue != opts.Queue:
		case opts.Priority != nil && j.Priority != *opts.Priority:
		case opts.MaxAttempts != 0 && j.MaxAttempts != opts.MaxAttempts:
		case len(opts.States) > 0 && !slices.Contains(opts.States, j.State):
		case !containsAll(j.Tags, opts.Tags):
		default:
			matched = append(matched, j)
		}
	}
	return matched, all
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func describe(o *RequireOpts) string {
	if o == nil {
		return "{}"
	}
	var parts []string
	if o.Queue != "" {
		parts = append(parts, "queue="+o.Queue)
	}
	if o.Priority != nil {
		parts = append(parts, fmt.Sprintf("priority=%d", *o.Priority))
	}
	if o.MaxAttempts != 0 {
		parts = append(parts, fmt.Sprintf("max_attempts=%d", o.MaxAttempts))
	}
	if len(o.States) > 0 {
		parts = append(parts, fmt.Sprintf("states=%v", o.States))
	}
	if len(o.Tags) > 0 {
		parts = append(parts, fmt.Sprintf("tags=%v", o.Tags))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// summary lists up to five jobs for a failure message.
func summary(jobs []*core.JobRow) string {
	var b strings.Builder
	for i, j := range jobs {
		if i == 5 {
			fmt.Fprintf(&b, "\n  … and %d more", len(jobs)-5)
			break
		}
		fmt.Fprintf(&b, "\n  job %d: queue=%s state=%s priority=%d max_attempts=%d tags=%v args=%s",
			j.ID, j.Queue, j.State, j.Priority, j.MaxAttempts, j.Tags, j.EncodedArgs)
	}
	return b.String()
}
