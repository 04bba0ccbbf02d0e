package core

import (
	"context"
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
	c.endLease(r)            // the handler returned
	c.renewLease(r, sent)    // the heartbeat's answer, sent before that
	if r.leaseTimer.Stop() { // true: the timer was armed again
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
	if !r2.leaseTimer.Stop() {
		t.Fatal("a running job's renewal did not arm its local lease deadline")
	}
}
