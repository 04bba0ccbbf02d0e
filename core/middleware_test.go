package core_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type ctxKey struct{}

// Middleware runs around every handler, outermost first, can pass a
// context value down and turn a result into another; OnError sees every
// failed attempt, a panic as *core.PanicError.
func TestMiddlewareAndErrorHook(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var mu sync.Mutex
	var order []string
	var reported []error
	ws := core.NewWorkers()
	ws.Use(
		core.OnError(func(ctx context.Context, job *core.JobRow, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		}),
		func(ctx context.Context, job *core.JobRow, next func(context.Context) error) error {
			mu.Lock()
			order = append(order, "outer:"+job.Kind)
			mu.Unlock()
			err := next(context.WithValue(ctx, ctxKey{}, "from middleware"))
			if err != nil && strings.Contains(err.Error(), "hopeless") {
				return core.Permanent(err) // a middleware may reclassify
			}
			return err
		},
	)
	var seen string
	core.MustAddWorker(ws, core.WorkFunc[bytesArgs](func(ctx context.Context, j *core.Job[bytesArgs]) error {
		switch j.Args.Mode {
		case "panic":
			panic("kaboom")
		case "hopeless":
			return errors.New("hopeless")
		}
		mu.Lock()
		seen, _ = ctx.Value(ctxKey{}).(string)
		mu.Unlock()
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws})
	ok, _ := core.Enqueue(ctx, pool, bytesArgs{Mode: "ok"}, nil)
	panicky, _ := core.Enqueue(ctx, pool, bytesArgs{Mode: "panic"}, &core.EnqueueOpts{MaxAttempts: 1})
	hopeless, _ := core.Enqueue(ctx, pool, bytesArgs{Mode: "hopeless"}, nil) // 25 attempts, but made permanent
	waitState(t, pool, ok.ID, core.StateSucceeded)
	pj := waitState(t, pool, panicky.ID, core.StateDead)
	hj := waitState(t, pool, hopeless.ID, core.StateDead)
	if hj.Attempt != 1 {
		t.Fatalf("middleware's Permanent ignored: %d attempts", hj.Attempt)
	}
	if !strings.Contains(pj.LastError, "kaboom") {
		t.Fatalf("panic not recorded: %q", pj.LastError)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen != "from middleware" || len(order) != 3 {
		t.Fatalf("context value %q, middleware calls %v", seen, order)
	}
	var pe *core.PanicError
	if len(reported) != 2 || !errors.As(errors.Join(reported...), &pe) || pe.Value != "kaboom" {
		t.Fatalf("error hook saw %v", reported)
	}
}
