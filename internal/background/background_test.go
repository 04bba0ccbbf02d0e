package background

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Stop cancels every loop's context and returns only after all of them
// have returned; the caller's cancellation of Start's context does not stop
// them; a runner starts once.
func TestRunner(t *testing.T) {
	var r Runner
	if err := r.Stop(context.Background(), "thing"); err != nil {
		t.Fatalf("stop before start: %v", err)
	}
	startCtx, cancelStart := context.WithCancel(context.Background())
	var running, returned atomic.Int32
	loop := func(ctx context.Context) {
		running.Add(1)
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // a loop finishing its work
		returned.Add(1)
	}
	if err := r.Start(startCtx, "thing", loop, loop); err != nil {
		t.Fatal(err)
	}
	cancelStart() // must not stop the loops
	deadline := time.Now().Add(10 * time.Second)
	for running.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if returned.Load() != 0 {
		t.Fatal("cancelling Start's context stopped a loop")
	}
	if err := r.Start(context.Background(), "thing", loop); err == nil || !strings.Contains(err.Error(), "thing: start: already started") {
		t.Fatalf("second start: %v", err)
	}
	if err := r.Stop(context.Background(), "thing"); err != nil {
		t.Fatal(err)
	}
	if n := returned.Load(); n != 2 {
		t.Fatalf("Stop returned with %d of 2 loops returned", n)
	}
	if err := r.Start(context.Background(), "thing", loop); err == nil {
		t.Fatal("restart after Stop allowed")
	}
}

// A Stop whose context ends first says so, naming the component.
func TestRunnerStopDeadline(t *testing.T) {
	var r Runner
	release := make(chan struct{})
	defer close(release)
	if err := r.Start(context.Background(), "thing", func(context.Context) { <-release }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := r.Stop(ctx, "thing")
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "thing: stop:") {
		t.Fatalf("stop past its deadline: %v", err)
	}
}
