package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// The delay function is pinned: exponential from Base, capped at Max, with
// jitter taking off up to Jitter of the delay.
func TestBackoffDelays(t *testing.T) {
	t.Parallel()
	noJitter := core.Backoff{Base: time.Second, Max: time.Minute, Rand: func() float64 { return 0 }}
	want := []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		if got := noJitter.RetryDelay(i+1, nil); got != w {
			t.Errorf("attempt %d: %s, want %s", i+1, got, w)
		}
	}
	// Rand near 1 takes off the full 10% default jitter.
	full := core.Backoff{Base: 10 * time.Second, Rand: func() float64 { return 0.5 }}
	if got := full.RetryDelay(1, nil); got != 9500*time.Millisecond {
		t.Errorf("half jitter: %s, want 9.5s", got)
	}
	wide := core.Backoff{Base: 10 * time.Second, Jitter: 0.5, Rand: func() float64 { return 0.5 }}
	if got := wide.RetryDelay(2, nil); got != 15*time.Second {
		t.Errorf("jitter 0.5 at rand 0.5, attempt 2: %s, want 15s", got)
	}
	none := core.Backoff{Base: 10 * time.Second, Jitter: -1, Rand: func() float64 { return 0.99 }}
	if got := none.RetryDelay(3, nil); got != 40*time.Second {
		t.Errorf("no jitter: %s, want 40s", got)
	}
	// Zero value: 1s base, 1h cap.
	zero := core.Backoff{Rand: func() float64 { return 0 }}
	if got := zero.RetryDelay(1, nil); got != time.Second {
		t.Errorf("zero value attempt 1: %s", got)
	}
	if got := zero.RetryDelay(40, nil); got != time.Hour {
		t.Errorf("zero value attempt 40: %s", got)
	}
	// Real randomness stays within [d·(1-jitter), d].
	r := core.Backoff{Base: time.Second}
	for i := 0; i < 1000; i++ {
		if d := r.RetryDelay(4, errors.New("x")); d < 7200*time.Millisecond || d > 8*time.Second {
			t.Fatalf("random jitter out of range: %s", d)
		}
	}
}

// RetryIn's delay is a directive, not part of the error: the stored error
// is the handler's own, and the delay is recorded beside it in the
// attempt's history.
func TestRetryInStoresTheErrorAsIsAndTheDelayBesideIt(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		return core.RetryIn(time.Hour, errors.New("card network timeout"))
	}))
	c := startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(context.Background(), pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the failure recorded", func() bool { return c.Stats().Retried == 1 })
	j, err := core.JobGet(context.Background(), pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.LastError != "card network timeout" || len(j.History) != 1 || j.History[0].Error != "card network timeout" {
		t.Fatalf("last_error %q, history %+v: want the handler's error as it is", j.LastError, j.History)
	}
	if j.History[0].RetryIn != time.Hour {
		t.Errorf("history records a retry in %v, want 1h", j.History[0].RetryIn)
	}
	if got := core.RetryIn(time.Second, errors.New("x")).Error(); got != "x" {
		t.Errorf("RetryIn's message %q, want the wrapped error's", got)
	}
}
