package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// Updates: a caller's synchronous, durable request into a running run
// (as Temporal's workflow updates). The caller's request is a row that commits
// before the run sees it; the run handles it at a HandleUpdate of its name
// and records the request with its checkpoint and the answer on the row, in
// one transaction; the caller waits for the answer. Reads of a run's state
// stay SetEvent and GetEvent.

var (
	// ErrUpdateRejected: the run refused the update, before applying it:
	// its request did not decode into the handler's type, or the
	// handler's Validate returned an error. Matched by an *UpdateError.
	ErrUpdateRejected = errors.New("workflow: update rejected")
	// ErrUpdateFailed: the update's handler returned an error (the run
	// goes on). Matched by an *UpdateError.
	ErrUpdateFailed = errors.New("workflow: update failed")
	// ErrUpdateNotHandled: the run ended without handling the update (no
	// HandleUpdate of its name was reached).
	ErrUpdateNotHandled = errors.New("workflow: the run ended without handling the update")
	// ErrUpdateInTransaction: Update was given a transaction: its request
	// must commit before the run can answer it. Use SendUpdate in the
	// transaction and UpdateResult after its commit.
	ErrUpdateInTransaction = errors.New("workflow: Update waits for its answer and cannot run in a transaction (use SendUpdate, then UpdateResult)")
)

// UpdateError is an update the run rejected or whose handler failed.
type UpdateError struct {
	RunID    string
	Name     string
	ID       int64
	Rejected bool // refused before it was applied (ErrUpdateRejected)
	Message  string
}

func (e *UpdateError) Error() string {
	what := "failed"
	if e.Rejected {
		what = "rejected"
	}
	return fmt.Sprintf("workflow: update %s (%d) of run %s %s: %s", e.Name, e.ID, e.RunID, what, e.Message)
}

// Is matches ErrUpdateRejected or ErrUpdateFailed.
func (e *UpdateError) Is(target error) bool {
	return (e.Rejected && target == ErrUpdateRejected) || (!e.Rejected && target == ErrUpdateFailed)
}

// UpdateOpts tune a HandleUpdate. The zero value (or nil) waits without
// limit and validates nothing.
type UpdateOpts[Req any] struct {
	// Timeout bounds the wait for an update (0: none); then HandleUpdate
	// returns false.
	Timeout time.Duration
	// Validate, when set, refuses a request before the handler runs: the
	// caller gets an *UpdateError matching ErrUpdateRejected, nothing is
	// recorded in the run's history, and the wait goes on for the next
	// request. It must not call this package's primitives.
	Validate func(req Req) error
}

// HandleUpdate waits for the next update request of name sent to the run
// (Update, SendUpdate), as WaitSignal waits for a signal, and handles it:
// the request is decoded into Req, validated (UpdateOpts.Validate), and
// handler applies it (it is workflow code: it may change the workflow's
// variables and call Step and the other primitives); its response, or its
// error, is the caller's answer. The request is recorded in the run's
// history ("update:<name>#<n>") in the transaction that answers the
// caller: a replay calls handler again with the same request (its steps
// answered from history), so the workflow's state is rebuilt, and the
// answer is not sent twice. A worker killed after the handler ran and
// before the answer committed leaves the request pending: the next
// execution handles the same request again, replaying the steps the
// handler had completed. A request that does not decode, or that Validate
// refuses, fails that update alone (ErrUpdateRejected for its caller) and
// the wait goes on. handled is false when UpdateOpts.Timeout passed first.
func HandleUpdate[Req, Resp any](wctx Context, name string, handler func(wctx Context, req Req) (Resp, error), opts *UpdateOpts[Req]) (handled bool, err error) {
	x := wctx.x
	if err := x.enter("HandleUpdate"); err != nil {
		return false, err
	}
	if handler == nil {
		return false, fmt.Errorf("workflow: run %s: HandleUpdate %q: nil handler", x.runID, name)
	}
	var o UpdateOpts[Req]
	if opts != nil {
		o = *opts
	}
	x.waitSeq["\x00update:"+name]++
	key := fmt.Sprintf("update:%s#%d", name, x.waitSeq["\x00update:"+name])
	pos, h := x.next("update", key)
	if h != nil && h.state == stepCompleted {
		if h.output == "" {
			return false, nil // timed out
		}
		var rec updateRecord
		var req Req
		if err := json.Unmarshal([]byte(h.output), &rec); err == nil {
			err = json.Unmarshal(rec.Request, &req)
		}
		if err != nil {
			x.fatal(fmt.Errorf("workflow: run %s: decode stored update %s: %w", x.runID, key, err))
		}
		handler(wctx, req) //nolint:errcheck // a replay rebuilds the workflow's state; the answer was sent
		return true, nil
	}
	x.checkCancel()
	var wakeAt *time.Time
	if h != nil {
		wakeAt = h.wakeAt
	}
	for {
		// The oldest pending request, or none: then the wait is recorded
		// (with its deadline) and the run suspends until Update wakes it.
		var id int64
		var raw string
		found := false
		x.fenced(func(ctx context.Context, tx pgx.Tx) error {
			found = false
			err := tx.QueryRow(ctx, sqlPendingUpdate, x.runID, name).Scan(&id, &raw)
			if err == nil {
				found = true
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if h == nil {
				d := time.Duration(-1)
				if o.Timeout > 0 {
					d = o.Timeout
				}
				wakeAt, err = x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "update", state: stepWaiting}, 0, nil, d)
				if err == nil {
					h = &stepRow{position: pos, key: key, kind: "update", state: stepWaiting, wakeAt: wakeAt}
				}
				return err
			}
			if wakeAt != nil && !wakeAt.After(x.now) {
				timedOut := &stepRow{position: pos, key: key, kind: "update", state: stepCompleted, errMsg: "timed out"}
				_, err = x.upsert(ctx, tx, timedOut, 1, wakeAt, 0)
				wakeAt = nil
				h = timedOut
				return err
			}
			// The wait is recorded and its timeout not reached: suspend
			// again (err is only the read's ErrNoRows here).
			return nil
		})
		if !found {
			if h != nil && h.state == stepCompleted {
				return false, nil
			}
			d := maxSuspend
			if wakeAt != nil {
				d = min(d, wakeAt.Sub(x.now))
			}
			x.suspend(d)
			return false, nil
		}
		var req Req
		reject := ""
		if err := json.Unmarshal([]byte(raw), &req); err != nil {
			reject = fmt.Sprintf("decode the request into %T: %v", req, err)
		} else if o.Validate != nil {
			if err := o.Validate(req); err != nil {
				reject = err.Error()
			}
		}
		if reject != "" {
			x.fenced(func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, sqlAnswerUpdate, id, "rejected", nil, boundError(reject))
				return err
			})
			x.r.announcer.announceUpdate(x.r.pool, id)
			x.r.logger.Info("relay: workflow update rejected", "run_id", x.runID, "workflow", x.run.workflow, "update", name, "update_id", id, "error", reject)
			continue
		}
		resp, herr := handler(wctx, req)
		var respJSON *string
		msg := ""
		if herr != nil {
			msg = boundError(herr.Error())
		} else if enc, err := encode("response of update "+name, resp); err != nil {
			msg = boundError(err.Error())
		} else {
			s := string(enc)
			respJSON = &s
		}
		state := "completed"
		recJSON, _ := json.Marshal(updateRecord{ID: id, Request: json.RawMessage(raw)})
		x.fenced(func(ctx context.Context, tx pgx.Tx) error {
			if _, err := x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "update", state: stepCompleted, output: string(recJSON)}, 1, nil, 0); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlAnswerUpdate, id, state, respJSON, msg)
			return err
		})
		// The caller is woken once the answer has committed.
		x.r.announcer.announceUpdate(x.r.pool, id)
		return true, nil
	}
}

// updateRecord is what an update's checkpoint stores: the request the
// handler applied (a replay applies it again).
type updateRecord struct {
	ID      int64           `json:"id"`
	Request json.RawMessage `json:"request"`
}

// SendUpdate puts an update request of name for run id, through db (in
// its transaction, if it is one), and wakes the run; it returns the
// update's id, for UpdateResult. The request is encoded as JSON within
// MaxSignalBytes and MaxSignalDepth (else ErrTooLarge, ErrTooDeep); a
// finished run is ErrRunFinished, an unknown one ErrRunNotFound. The
// update waits, pending, until the run reaches a HandleUpdate of name.
func SendUpdate(ctx context.Context, db core.DB, id, name string, req any) (int64, error) {
	if name == "" || len(name) > 255 {
		return 0, fmt.Errorf("workflow: update %q of run %s: the name must be 1 to 255 bytes", name, id)
	}
	enc, err := encode("update "+name, req)
	if err == nil {
		err = checkSignal(enc)
	}
	if err != nil {
		return 0, fmt.Errorf("workflow: update %s of run %s: %w", name, id, err)
	}
	var uid int64
	err = deliver(ctx, db, id, sqlInsertUpdate, []any{id, name, string(enc)}, &uid)
	if err != nil {
		return 0, fmt.Errorf("workflow: update %s of run %s: %w", name, id, err)
	}
	return uid, nil
}

// UpdateResult waits for the answer to update uid (SendUpdate) and decodes
// its response into Resp: an *UpdateError when the run rejected it
// (ErrUpdateRejected) or its handler failed (ErrUpdateFailed);
// ErrUpdateNotHandled when the run ended first. It reads the update
// through db and waits on reg's one shared LISTEN connection (as
// Handle.Result; no pool connection is held while waiting): the worker
// that answers announces the answer after its commit, and the end of the
// update's run wakes it too. A notification missed (a worker killed
// between the commit and its announcement) is caught by a poll once a
// second. A nil reg, or one made without a pool or closed, has no
// listener: UpdateResult then polls every few milliseconds at first,
// backing off to half a second. ctx bounds the wait.
func UpdateResult[Resp any](ctx context.Context, db core.DB, reg *Registry, uid int64) (Resp, error) {
	return updateResult[Resp](ctx, db, reg, uid, "")
}

// updatePollFallback is how often UpdateResult reads an update it waits
// for on the listener, for a notification missed.
const updatePollFallback = time.Second

// updateResult is UpdateResult; runID, when known (Update), is the
// update's run, whose end is waited for from the first read.
func updateResult[Resp any](ctx context.Context, db core.DB, reg *Registry, uid int64, runID string) (Resp, error) {
	var zero Resp
	ex, err := dbx.For(db)
	if err != nil {
		return zero, fmt.Errorf("workflow: result of update %d: %w", uid, err)
	}
	var w *waiter
	fallback := updatePollFallback
	if reg != nil && reg.pool != nil && reg.waiter.open() {
		w = &reg.waiter
		fallback = cmp.Or(reg.updatePoll, fallback)
	}
	key := updateKey(strconv.FormatInt(uid, 10))
	delay := 2 * time.Millisecond
	for {
		if w != nil && !w.open() {
			w, delay = nil, 2*time.Millisecond // Registry.Close: poll from here on
		}
		var woken <-chan struct{}
		release := func() {}
		subscribedRun := runID
		if w != nil {
			keys := []string{key}
			if runID != "" {
				keys = append(keys, runID) // its end answers ErrUpdateNotHandled
			}
			var connected <-chan struct{}
			woken, connected, release = w.subscribeAll(keys)
			// Read only once the listener listens, or a notification
			// could slip between the read and the LISTEN.
			select {
			case <-connected:
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				release()
				return zero, fmt.Errorf("workflow: result of update %d: %w", uid, ctx.Err())
			}
		}
		var name, state, resp, msg, runState string
		var finished, found bool
		err := ex.Query(ctx, sqlUpdateOutcome, []any{uid}, func(r dbx.Scanner) error {
			found = true
			return r.Scan(&runID, &name, &state, &resp, &msg, &finished, &runState)
		})
		if err != nil || !found || state != "pending" || finished {
			release()
		}
		switch {
		case err != nil:
			return zero, fmt.Errorf("workflow: result of update %d: %w", uid, err)
		case !found:
			return zero, fmt.Errorf("workflow: result of update %d: not found (its run was deleted?)", uid)
		case state == "rejected":
			return zero, &UpdateError{RunID: runID, Name: name, ID: uid, Rejected: true, Message: msg}
		case state == "completed" && msg != "":
			return zero, &UpdateError{RunID: runID, Name: name, ID: uid, Message: msg}
		case state == "completed":
			var out Resp
			if err := json.Unmarshal([]byte(resp), &out); err != nil {
				return zero, fmt.Errorf("workflow: result of update %s (%d) of run %s: decode response into %T: %w", name, uid, runID, out, err)
			}
			return out, nil
		case finished:
			return zero, fmt.Errorf("workflow: update %s (%d) of run %s: %w (it ended %s)", name, uid, runID, ErrUpdateNotHandled, runState)
		}
		if w != nil && subscribedRun == "" {
			// The first read named the run: wait on its end as well,
			// from a read made once subscribed to it.
			release()
			continue
		}
		if w != nil {
			delay = fallback // the notification comes first; this is the fallback
		}
		select {
		case <-ctx.Done():
			release()
			return zero, fmt.Errorf("workflow: result of update %s (%d) of run %s: %w", name, uid, runID, ctx.Err())
		case <-woken:
		case <-time.After(delay):
		}
		release()
		if w == nil {
			delay = min(delay*2, 500*time.Millisecond)
		}
	}
}

// Update sends an update request of name to run id and waits for its
// answer (SendUpdate, then UpdateResult, waiting on reg's listener): a
// synchronous, durable request into a running run, as Temporal's workflow
// updates. db must not be a transaction (ErrUpdateInTransaction): the
// request commits first, then the run answers. The request survives a
// worker's death: it stays pending until a run's execution records its
// answer.
func Update[Resp any](ctx context.Context, db core.DB, reg *Registry, id, name string, req any) (Resp, error) {
	var zero Resp
	if dbx.InTransaction(db) {
		return zero, fmt.Errorf("workflow: update %s of run %s: %w", name, id, ErrUpdateInTransaction)
	}
	uid, err := SendUpdate(ctx, db, id, name, req)
	if err != nil {
		return zero, err
	}
	return updateResult[Resp](ctx, db, reg, uid, id)
}
