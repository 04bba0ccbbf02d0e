// Package background runs a component's loops from Start to Stop: the
// lifecycle the scheduler and the outbox dispatcher share (and the layers
// above will). The loops run on a context that outlives the one given to
// Start and ends at Stop; Stop waits for them to return.
package background

import (
	"context"
	"fmt"
	"sync"
)

// Runner starts loops once and stops them once. The zero value is ready.
type Runner struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start runs each loop in a goroutine of its own. Values of ctx reach the
// loops; its cancellation does not (use Stop). A runner starts once:
// another Start, even after Stop, is an error naming component.
func (r *Runner) Start(ctx context.Context, component string, loops ...func(context.Context)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return fmt.Errorf("%s: start: already started", component)
	}
	r.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel, r.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	for _, loop := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); loop(runCtx) }()
	}
	go func() { wg.Wait(); close(r.done) }()
	return nil
}

// Stop cancels the loops' context and waits until they have all returned,
// or until ctx ends (an error naming component). Stop before Start, or a
// second Stop, returns nil at once.
func (r *Runner) Stop(ctx context.Context, component string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		return nil
	}
	r.cancel()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: stop: %w", component, ctx.Err())
	}
}
