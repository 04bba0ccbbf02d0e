package workflow

import (
	"time"
)

// Sleep is a durable timer: the run's execution ends, and the run comes
// back d later (its job is queued again with run_at, holding no goroutine
// or connection meanwhile), then replays past the sleep. The wake-up time
// is checkpointed under key on the database's clock, so a sleep survives
// restarts and is not restarted by replays. Sleep(0) still suspends the
// run once. The error is non-nil only if the run is being cancelled.
func Sleep(wctx Context, key string, d time.Duration) error {
	if err := wctx.x.enter("Sleep"); err != nil {
		return err
	}
	return sleep(wctx, key, nil, d)
}

// SleepUntil is Sleep until the instant t.
func SleepUntil(wctx Context, key string, t time.Time) error {
	if err := wctx.x.enter("SleepUntil"); err != nil {
		return err
	}
	return sleep(wctx, key, &t, 0)
}

func sleep(wctx Context, key string, until *time.Time, d time.Duration) error {
	x := wctx.x
	x.userKey("sleep", key)
	pos, h := x.next("sleep", key)
	if h != nil {
		if h.state == stepCompleted || h.wakeAt == nil || !h.wakeAt.After(x.now) {
			if h.state != stepCompleted {
				x.dueWaits = append(x.dueWaits, pos)
			}
			return nil
		}
		x.checkCancel()
		x.suspend(h.wakeAt.Sub(x.now))
	}
	x.checkCancel()
	x.record(&stepWrite{row: &stepRow{position: pos, key: key, kind: "sleep", state: stepWaiting}, wakeAt: until, delay: max(d, 0)})
	if until != nil {
		d = until.Sub(x.now)
	}
	x.suspend(d)
	return nil
}
