package core

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// A heartbeat collects the jobs in flight, then renews them: a job whose
// handler returned while the renewal was on its way must not have its
// local lease deadline re-armed by it, nor lose a lease it no longer
// needs (which logged "lease lost while running" and counted a lost lease
// 24 s after a job long done).
func TestRenewalAfterTheHandlerReturnedArmsNothing(t *testing.T) {
	t.Parallel()
	c := &Client{leaseBudget: time.Hour, epoch: time.Now()}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r := &running{row: &JobRow{ID: 1, Kind: "k"}, ctx: ctx, cancel: cancel}
	sent := time.Now()
	c.startLease(r, sent)
	c.endLease(r)         // the handler returned
	c.renewLease(r, sent) // the heartbeat's answer, sent before that
	g := r.group
	if g.live != 0 || g.timer.Stop() { // true: the timer was armed again
		t.Fatal("a renewal re-armed the local lease deadline of a job whose handler returned")
	}
	c.loseLease(r, "not renewed in time (local lease deadline)")
	if r.lost.Load() || c.stats.leaseLost.Load() != 0 || context.Cause(ctx) != nil {
		t.Fatalf("a job whose handler returned lost its lease: lost %v, counted %d, cause %v", r.lost.Load(), c.stats.leaseLost.Load(), context.Cause(ctx))
	}

	// A job still running is renewed.
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	defer cancel2(nil)
	r2 := &running{row: &JobRow{ID: 2, Kind: "k"}, ctx: ctx2, cancel: cancel2}
	c.startLease(r2, sent)
	c.renewLease(r2, sent)
	if r2.group.live != 1 || !r2.group.timer.Stop() {
		t.Fatal("a running job's renewal did not arm its local lease deadline")
	}
}

// One timer watches the local lease deadlines of a claim's jobs: when it
// fires, a job whose deadline passed loses its lease, a renewed one and one
// whose handler returned do not, and the timer waits again for the
// earliest deadline left; once every job ended it is stopped.
func TestLeaseGroupLosesOnlyPassedDeadlines(t *testing.T) {
	t.Parallel()
	c := &Client{leaseBudget: time.Hour, epoch: time.Now().Add(-3 * time.Hour), logger: slog.New(slog.DiscardHandler)}
	m, err := newMetrics(c)
	if err != nil {
		t.Fatal(err)
	}
	c.metrics = m
	sent := time.Now().Add(-2 * time.Hour) // every deadline has passed
	g := c.newLeaseGroup(sent, 3)
	defer g.timer.Stop()
	var runs []*running
	for i := range 3 {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		r := &running{row: &JobRow{ID: int64(i + 1), Kind: "k"}, ctx: ctx, cancel: cancel}
		g.add(r, sent)
		runs = append(runs, r)
	}
	g.seal()
	stale, renewed, ended := runs[0], runs[1], runs[2]
	c.renewLease(renewed, time.Now())
	c.endLease(ended)
	g.check()
	if !stale.lost.Load() || !errors.Is(context.Cause(stale.ctx), ErrLeaseLost) {
		t.Fatalf("a job past its local lease deadline kept its lease: lost %v, cause %v", stale.lost.Load(), context.Cause(stale.ctx))
	}
	if renewed.lost.Load() || ended.lost.Load() || c.stats.leaseLost.Load() != 1 {
		t.Fatalf("renewed lost %v, ended lost %v, counted %d: want only the stale job lost", renewed.lost.Load(), ended.lost.Load(), c.stats.leaseLost.Load())
	}
	if g.live != 1 || g.runs[renewed.slot] != renewed {
		t.Fatalf("the group watches %d jobs after the check, want the renewed one", g.live)
	}
	c.endLease(stale) // its handler returns after the cancel: nothing changes
	c.endLease(renewed)
	if g.live != 0 || g.timer.Stop() {
		t.Fatal("the group's timer still runs after every job ended")
	}
}

// The heartbeat renews a finished attempt whose outcome waits in the
// completer (pending or being written) only while it may hold its lease:
// not one whose handler lost it, nor one whose local lease deadline has
// passed (its renewals failed meanwhile: its lease may have expired in the
// database), whose outcome the fence alone then decides.
func TestOutcomesLeasedOnlyWithinTheirDeadline(t *testing.T) {
	t.Parallel()
	c := &Client{leaseBudget: time.Hour, epoch: time.Now()}
	p := newCompleter(c)
	defer p.cancel()
	sent := time.Now()
	mk := func(id int64) outcome {
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		r := &running{row: &JobRow{ID: id, Kind: "k"}, ctx: ctx, cancel: cancel}
		r.row.run = r
		c.startLease(r, sent)
		c.endLease(r) // the handler returned
		return outcome{row: r.row, kind: outcomeSuccess, lost: r.lost.Load()}
	}
	fresh, writing, passed, lost := mk(1), mk(2), mk(3), mk(4)
	passed.row.run.deadline.Store(int64(time.Since(c.epoch) - time.Second))
	lost.lost = true
	p.pending = []outcome{fresh, passed, lost, {row: &JobRow{ID: 5}}} // 5: no attempt of this client
	p.writing = []outcome{writing}
	var ids []int64
	for _, r := range p.leased(nil) {
		ids = append(ids, r.row.ID)
	}
	if len(ids) != 2 || ids[0] != 2 || ids[1] != 1 {
		t.Fatalf("leased %v, want [2 1] (the one being written, then the fresh pending one)", ids)
	}
	// A renewal moves the deadline of a finished attempt; one lost stays lost.
	c.renewOutcomeLease(passed.row.run, time.Now())
	if c.leasePassed(passed.row.run) {
		t.Fatal("a renewed outcome's lease is still past its deadline")
	}
	lost.row.run.lost.Store(true)
	before := lost.row.run.deadline.Load()
	c.renewOutcomeLease(lost.row.run, time.Now().Add(time.Minute))
	if lost.row.run.deadline.Load() != before {
		t.Fatal("a lost attempt's deadline moved")
	}
}
