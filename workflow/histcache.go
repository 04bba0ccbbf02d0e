package workflow

import "sync"

// A run that suspends and is executed again in the same process would
// reread its whole history on every execution: a cost that grows with the
// history, paid on each wake-up. The registry keeps, for runs that
// suspended, the part of their history that cannot change while the run
// keeps its job and generation: the steps from position 0 on that are
// completed or failed, up to the first that is not. Nothing rewrites such a
// step in place: a later execution rewrites only a retrying step or a
// waiting sleep or wait; Retry, which drops steps, gives the run a new
// job; ContinueAsNew drops the history with a new generation. The next
// execution then reads the steps from the first position it does not
// hold, and takes the others from here, if the run it loads is still the
// one the history was kept for: the same job and generation, and exactly
// the executions counted since (sqlTouchRun counts each execution that
// wrote, so another process's execution meanwhile is seen, as is any write
// this process does not know committed). Any doubt reads the whole
// history, as every execution in another process does.

const (
	// histCacheMinSteps is the shortest history kept: shorter ones cost
	// little to read again.
	histCacheMinSteps = 64
	// histCacheMaxSteps bounds the steps kept over all runs (some 100
	// bytes each, plus their outputs).
	histCacheMaxSteps = 200_000
)

// histCache is a registry's kept histories, by run id.
type histCache struct {
	mu    sync.Mutex
	runs  map[string]*keptHistory
	steps int // over all runs
}

// keptHistory is the unchanging prefix of a run's history and the run it
// was read for.
type keptHistory struct {
	jobID      int64
	generation int
	executions int // the run's count once the execution that kept it ended
	steps      []stepRow
}

// take removes and returns run id's kept history, nil if none.
func (c *histCache) take(id string) *keptHistory {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.runs[id]
	if k != nil {
		delete(c.runs, id)
		c.steps -= len(k.steps)
	}
	return k
}

// put keeps k for run id, in place of what was kept, dropping other runs'
// when the bound is reached (any: a run resumed elsewhere never takes its
// own).
func (c *histCache) put(id string, k *keptHistory) {
	if len(k.steps) < histCacheMinSteps || len(k.steps) > histCacheMaxSteps {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.runs[id]; old != nil {
		// Out of the map before the eviction, which would count it again.
		delete(c.runs, id)
		c.steps -= len(old.steps)
	}
	if c.runs == nil {
		c.runs = map[string]*keptHistory{}
	}
	for other, o := range c.runs {
		if c.steps+len(k.steps) <= histCacheMaxSteps {
			break
		}
		delete(c.runs, other)
		c.steps -= len(o.steps)
	}
	c.runs[id] = k
	c.steps += len(k.steps)
}

// fits reports whether k was kept for the run as loaded.
func (k *keptHistory) fits(r *runInfo) bool {
	return k.jobID == r.jobID && k.generation == r.generation && k.executions == r.executions
}

// unchangingPrefix is the steps of hist from position 0 that are completed
// or failed, up to the first that is not, as values: kept (steps known to
// be such, not shared with hist) extended by those of hist after them.
func unchangingPrefix(kept []stepRow, hist map[int]*stepRow) []stepRow {
	out := kept
	for {
		s := hist[len(out)]
		if s == nil || (s.state != stepCompleted && s.state != stepFailed) {
			return out
		}
		v := *s
		v.attempt = nil
		out = append(out, v)
	}
}
