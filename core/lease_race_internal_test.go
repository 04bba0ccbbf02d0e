package core

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Renewals, handler ends and the group's timer run at once (run with
// -race): renewals land while the timer fires and compacts the group, and
// handlers end meanwhile. A job never renewed loses its lease; a job whose
// handler ended first never does; once every job ended the group is empty.
func TestLeaseGroupUnderConcurrentRenewals(t *testing.T) {
	t.Parallel()
	c := &Client{leaseBudget: 2 * time.Millisecond, epoch: time.Now(), logger: slog.New(slog.DiscardHandler)}
	m, err := newMetrics(c)
	if err != nil {
		t.Fatal(err)
	}
	c.metrics = m
	const n = 64
	sent := time.Now()
	g := c.newLeaseGroup(sent, n)
	runs := make([]*running, n)
	for i := range runs {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		runs[i] = &running{row: &JobRow{ID: int64(i), Kind: "k"}, ctx: ctx, cancel: cancel}
		g.add(runs[i], sent)
	}
	g.seal()
	// Job 0 is never renewed; jobs 1..n/2 end at once; the rest are
	// renewed until their handler ends.
	for _, r := range runs[1 : n/2+1] {
		c.endLease(r)
	}
	var wg sync.WaitGroup
	for _, r := range runs[n/2+1:] {
		wg.Go(func() {
			for range 200 {
				c.renewLease(r, time.Now())
				g.check() // as the timer does, at once with the others
			}
			c.endLease(r)
		})
	}
	wg.Wait()
	// Job 0's deadline is its claim's: past once the budget is.
	time.Sleep(time.Until(sent.Add(c.leaseBudget)))
	g.check()
	if !runs[0].lost.Load() {
		t.Fatal("a job never renewed kept its lease")
	}
	for _, r := range runs[1 : n/2+1] {
		if r.lost.Load() {
			t.Fatalf("job %d lost its lease after its handler ended", r.row.ID)
		}
	}
	g.mu.Lock()
	live := g.live
	g.mu.Unlock()
	if live != 0 {
		t.Fatalf("%d jobs left in the group after every job ended or lost its lease", live)
	}
}
