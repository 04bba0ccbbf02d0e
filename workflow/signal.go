package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// Signal puts payload (encoded as JSON) in run id's mailbox under name, and
// wakes the run, through db: given a transaction (pgx, bun or database/sql),
// the signal exists and the run wakes only if that transaction commits.
// A signal sent before the run waits for it is kept until a WaitSignal of
// that name consumes it; each signal is consumed by exactly one wait, in
// the order sent. Signalling a finished run is ErrRunFinished; an unknown
// one ErrRunNotFound. A payload that encodes to more than MaxSignalBytes
// is ErrTooLarge, one nested deeper than MaxSignalDepth ErrTooDeep, and
// nothing is sent.
//
// The wake-up locks the run's job row until db's transaction ends: keep
// that transaction short.
func Signal(ctx context.Context, db core.DB, id, name string, payload any) error {
	enc, err := encode("signal "+name, payload)
	if err == nil {
		err = checkSignal(enc)
	}
	if err != nil {
		return fmt.Errorf("workflow: signal %s to run %s: %w", name, id, err)
	}
	err = deliver(ctx, db, id, sqlInsertSignal, []any{id, name, string(enc)})
	if err != nil {
		return fmt.Errorf("workflow: signal %s to run %s: %w", name, id, err)
	}
	return nil
}

// deliver runs insert, a statement that puts a message (a signal, an
// update request) in run id's mailbox and returns what scan names followed
// by the run's job id (0: no job to wake), on db in one transaction; then
// wakes the job. No row means the run is missing or finished
// (runMissing says which).
func deliver(ctx context.Context, db core.DB, id, insert string, args []any, scan ...any) error {
	return inTx(ctx, db, func(tx core.DB) error {
		ex, err := dbx.For(tx)
		if err != nil {
			return err
		}
		var job int64
		found := false
		if err := ex.Query(ctx, insert, args, func(r dbx.Scanner) error {
			found = true
			return r.Scan(append(scan, &job)...)
		}); err != nil {
			return err
		}
		if !found {
			return runMissing(ctx, ex, id)
		}
		if job == 0 {
			return nil
		}
		return core.Wake(ctx, tx, job)
	})
}

// setAsideSignal is a signal a wait set aside, for the log.
type setAsideSignal struct {
	id  int64
	msg string
}

// maxSetAsidePerWrite bounds the signals one wait's write sets aside; a
// wait that meets more goes on in its next write.
const maxSetAsidePerWrite = 100

// MaxSignalBytes bounds a signal's payload, encoded as JSON (64 KiB):
// Signal refuses a larger one with ErrTooLarge. A signal carries a
// decision or a key, not data.
const MaxSignalBytes = 64 << 10

// MaxSignalDepth bounds the nesting of a signal's payload (arrays and
// objects within each other): Signal refuses a deeper one with ErrTooDeep.
const MaxSignalDepth = 64

// checkSignal refuses an encoded payload over MaxSignalBytes or nested
// deeper than MaxSignalDepth.
func checkSignal(enc []byte) error {
	if len(enc) > MaxSignalBytes {
		return fmt.Errorf("%w: the payload encodes to %d bytes, over the %d-byte limit of a signal (MaxSignalBytes)", ErrTooLarge, len(enc), MaxSignalBytes)
	}
	if d := jsonDepth(enc); d > MaxSignalDepth {
		return fmt.Errorf("%w: the payload is nested %d deep, over the limit of %d for a signal (MaxSignalDepth)", ErrTooDeep, d, MaxSignalDepth)
	}
	return nil
}

// jsonDepth is how deep arrays and objects nest in the valid JSON b.
func jsonDepth(b []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// runMissing says why a write found no unfinished run id: ErrRunNotFound,
// or ErrRunFinished naming the state the run ended in.
func runMissing(ctx context.Context, ex dbx.Execer, id string) error {
	found := false
	var state string
	if err := ex.Query(ctx, sqlRunState, []any{id}, func(r dbx.Scanner) error { found = true; return r.Scan(&state) }); err != nil {
		return err
	}
	if found {
		return fmt.Errorf("%w: it ended %s", ErrRunFinished, state)
	}
	return ErrRunNotFound
}

// WaitSignal waits for the next signal called name sent to the run, and
// returns its payload decoded into T. A signal whose payload does not
// decode into T (a wrong type, say) is set aside, not received: it leaves
// the mailbox with its decoding error (the admin API lists it with the
// run), a warning is logged with the run id, and the wait goes on with the
// next signal of that name. The run never fails for a bad signal. The run suspends (no goroutine or
// connection held) until a signal arrives or timeout passes (0 waits
// without limit); then ok is false and err nil. The signal is consumed in
// the transaction that checkpoints the wait, so exactly one wait receives
// it even when two executions race. Successive waits for one name are
// distinct steps ("signal:<name>#<n>").
func WaitSignal[T any](wctx Context, name string, timeout time.Duration) (payload T, ok bool, err error) {
	x := wctx.x
	if err := x.enter("WaitSignal"); err != nil {
		return payload, false, err
	}
	x.waitSeq[name]++
	key := fmt.Sprintf("signal:%s#%d", name, x.waitSeq[name])
	pos, h := x.next("signal", key)
	decode := func(s *stepRow) (T, bool, error) {
		var v T
		if s.output == "" {
			return v, false, nil // timed out
		}
		if err := json.Unmarshal([]byte(s.output), &v); err != nil {
			return v, true, fmt.Errorf("workflow: run %s: decode signal %s into %T: %w", x.runID, name, v, err)
		}
		return v, true, nil
	}
	if h != nil && h.state == stepCompleted {
		return decode(h)
	}
	x.checkCancel()
	var wakeAt *time.Time
	if h != nil {
		wakeAt = h.wakeAt
	}
	var got *stepRow
	var setAside []setAsideSignal
	more := false // set aside as many as one write takes: go on in the next
	x.fenced(func(ctx context.Context, tx pgx.Tx) error {
		got, setAside, more = nil, setAside[:0], false
		var err error
		for {
			var id int64
			var p string
			err = tx.QueryRow(ctx, sqlConsumeSignal, x.runID, name, pos).Scan(&id, &p)
			if err != nil {
				break
			}
			var v T
			if derr := json.Unmarshal([]byte(p), &v); derr != nil {
				msg := boundError(fmt.Sprintf("decode signal %s into %T: %v", name, v, derr))
				if _, err := tx.Exec(ctx, sqlSetSignalAside, id, msg); err != nil {
					return fmt.Errorf("set signal %d aside: %w", id, err)
				}
				setAside = append(setAside, setAsideSignal{id: id, msg: msg})
				if len(setAside) == maxSetAsidePerWrite {
					more = true
					return nil
				}
				continue
			}
			got = &stepRow{position: pos, key: key, kind: "signal", state: stepCompleted, output: p}
			_, err = x.upsert(ctx, tx, got, 1, nil, 0)
			return err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if h == nil {
			s := &stepRow{position: pos, key: key, kind: "signal", state: stepWaiting}
			var d time.Duration = -1
			if timeout > 0 {
				d = timeout
			}
			wakeAt, err = x.upsert(ctx, tx, s, 0, nil, d)
			return err
		}
		if wakeAt != nil && !wakeAt.After(x.now) {
			got = &stepRow{position: pos, key: key, kind: "signal", state: stepCompleted, errMsg: "timed out"}
			_, err = x.upsert(ctx, tx, got, 1, wakeAt, 0)
			return err
		}
		return nil
	})
	for _, s := range setAside {
		x.r.logger.Warn("relay: workflow signal set aside: its payload does not decode into the type its wait asks for; the run waits on",
			"run_id", x.runID, "workflow", x.run.workflow, "signal", name, "signal_id", s.id, "error", s.msg)
	}
	if got != nil {
		return decode(got)
	}
	if more {
		x.suspend(0) // more signals to look at: at once, in a new write
	}
	d := maxSuspend
	if wakeAt != nil {
		d = min(d, wakeAt.Sub(x.now))
	}
	x.suspend(d)
	return payload, false, nil
}
