package scheduler

import "time"

// plan is what one due schedule does at one tick.
type plan struct {
	fires  []time.Time // to enqueue, oldest first
	missed int         // missed fires dropped by the catch-up policy (at least)
	next   time.Time   // the first fire after now: the schedule's new next_fire_at
}

// planFires decides which fires of a schedule to enqueue at now, given the
// first unhandled fire. Fires within grace of now are on time and all kept;
// of the older (missed) ones, keep says how many of the latest to keep.
//
// It never walks more fires than it keeps plus a bounded factor, however long
// the schedule went unfired: it looks back from now over growing windows
// instead of forward from the first unhandled fire.
func planFires(s *Spec, first, now time.Time, grace time.Duration, keep int) plan {
	if s.every > 0 {
		return planEvery(s.every, first, now, grace, keep)
	}
	window := grace + time.Minute
	for {
		from := now.Add(-window)
		fromFirst := !from.After(first)
		var due []time.Time
		f := first
		if !fromFirst {
			f = s.Next(from)
		}
		for !f.IsZero() && !f.After(now) {
			due = append(due, f)
			f = s.Next(f)
		}
		onTime := 0
		for i := len(due) - 1; i >= 0 && now.Sub(due[i]) <= grace; i-- {
			onTime++
		}
		missedInWindow := len(due) - onTime
		if fromFirst || missedInWindow >= keep+1 {
			kept := min(keep, missedInWindow)
			p := plan{fires: due[missedInWindow-kept:], next: f, missed: missedInWindow - kept}
			if !fromFirst {
				p.missed++ // and more before the window
			}
			return p
		}
		window *= 4
	}
}

// planEvery is planFires for @every schedules, whose fires are first + k·d.
func planEvery(d time.Duration, first, now time.Time, grace time.Duration, keep int) plan {
	if now.Before(first) {
		return plan{next: first}
	}
	last := int64(now.Sub(first) / d) // fires 0..last are due
	onTimeFrom := max(int64(0), last-int64(grace/d))
	for onTimeFrom > 0 && now.Sub(first.Add(time.Duration(onTimeFrom-1)*d)) <= grace {
		onTimeFrom--
	}
	for onTimeFrom <= last && now.Sub(first.Add(time.Duration(onTimeFrom)*d)) > grace {
		onTimeFrom++
	}
	keepFrom := max(0, onTimeFrom-int64(keep))
	p := plan{next: first.Add(time.Duration(last+1) * d), missed: int(keepFrom)}
	for k := keepFrom; k <= last; k++ {
		p.fires = append(p.fires, first.Add(time.Duration(k)*d))
	}
	return p
}
