package core

import (
	"context"
	"runtime/debug"
)

// Middleware runs around the handler of every job a Workers set runs:
// logging, error reporting (Sentry and the like), metrics, a context value
// for the handler, or a layer built on jobs (workflows). It gets the job
// and next, which runs the rest of the chain and then the handler, and
// returns the attempt's result: nil for success, or an error that is
// classified like a handler's (Permanent, RetryIn, …). A middleware may
// change the error, or not call next at all.
//
// A handler's panic reaches middleware as a *PanicError returned by next,
// never as a panic. Middleware does not run for jobs no handler can take
// (an unknown kind, an undecodable row): those fail before any code of
// the kind runs.
type Middleware func(ctx context.Context, job *JobRow, next func(ctx context.Context) error) error

// Use adds middleware to every kind of ws, registered before or after:
// the first added runs outermost. Call it while setting up, before a
// client using ws starts.
func (ws *Workers) Use(mw ...Middleware) {
	ws.middleware = append(ws.middleware, mw...)
}

// OnError returns a Middleware that calls report with every failed
// attempt's error (panics included, as *PanicError), then returns the
// error unchanged: the hook for error reporting. report runs in the
// attempt's goroutine, before the failure is recorded; keep it quick.
func OnError(report func(ctx context.Context, job *JobRow, err error)) Middleware {
	return func(ctx context.Context, job *JobRow, next func(context.Context) error) error {
		err := next(ctx)
		if err != nil {
			report(ctx, job, err)
		}
		return err
	}
}

// chain runs handler inside ws's middleware.
func (ws *Workers) chain(ctx context.Context, row *JobRow, handler func(context.Context, *JobRow) error) error {
	return ws.step(ctx, row, 0, handler)
}

func (ws *Workers) step(ctx context.Context, row *JobRow, i int, handler func(context.Context, *JobRow) error) error {
	if i == len(ws.middleware) {
		return recovered(ctx, row, handler)
	}
	return ws.middleware[i](ctx, row, func(ctx context.Context) error {
		return ws.step(ctx, row, i+1, handler)
	})
}

// recovered calls handler, turning its panic into a *PanicError so that
// middleware sees an error.
func recovered(ctx context.Context, row *JobRow, handler func(context.Context, *JobRow) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return handler(ctx, row)
}
