package workflow

import (
	"strconv"
	"strings"
	"time"
)

// One statement per checkpoint: the execution's bookkeeping (the run's
// touch or a read of its cancel flag, due sleeps, a state change), its
// checkpoints (any number, one INSERT reading arrays), the run's outcome
// and the lease check, as the data-modifying CTEs of one statement, which
// PostgreSQL runs as one implicit transaction: all of it commits under the
// lease, or none of it. The lease check runs last, in the outer query,
// after every CTE has run to its end (each is read through an aggregate in
// the FROM list), so rows are locked in the order every writer follows:
// the run's row (its updates) and its steps, then its job's. The foreign
// key checks of the step rows run at the very end of the statement, after
// the lease check: they lock the run's row FOR KEY SHARE, which no writer
// holding a lock on a job row conflicts with (Cancel and Signal take the
// run's row FOR NO KEY UPDATE; only deleting a run, which locks no job,
// conflicts), so no two writers deadlock on it either.

// checkpointStmt builds a statement. $1 is the run id.
type checkpointStmt struct {
	ctes  []string
	names []string
	args  []any
}

func (c *checkpointStmt) param(v any) string {
	c.args = append(c.args, v)
	return "$" + strconv.Itoa(len(c.args))
}

func (c *checkpointStmt) cte(name, body string) {
	c.ctes = append(c.ctes, name+" AS ("+body+")")
	c.names = append(c.names, name)
}

// checkpointStatement returns the one statement of a write, and ok false
// when this write cannot be one statement: it changes the run row twice
// (a touch, a state change, an outcome: each a transition the run's
// trigger checks, in order), or writes one step row twice (one statement
// cannot change a row twice). The statement returns one row: the cancel
// flag (false when not read) and a bool: given lease (job id and token),
// that of the lease check; given bound instead, that of setting the
// transaction's idle timeout to bound milliseconds (see writeTx).
func (x *execution) checkpointStatement(readCancel bool, fin *outcome, writes []*stepWrite, lease []any, bound string) (sql string, args []any, ok bool) {
	touch := readCancel && !x.touched
	runWrites := 0
	for _, w := range []bool{touch, x.setState != "", fin != nil} {
		if w {
			runWrites++
		}
	}
	if runWrites > 1 {
		return "", nil, false
	}
	seen := map[int]bool{}
	for _, p := range x.dueWaits {
		seen[p] = true
	}
	for _, w := range writes {
		if seen[w.row.position] {
			return "", nil, false
		}
		seen[w.row.position] = true
	}
	c := &checkpointStmt{args: []any{x.runID}}
	cancel := "false"
	switch {
	case touch:
		c.cte("r", sqlTouchRun)
		cancel = "(SELECT bool_or(cancel_requested) FROM r)"
	case readCancel:
		c.cte("r", sqlCancelRequested)
		cancel = "(SELECT bool_or(cancel_requested) FROM r)"
	}
	if len(x.dueWaits) > 0 {
		c.cte("w", strings.Replace(sqlCompleteWaits, "$2", c.param(x.dueWaits), 1)+"\nRETURNING 1")
	}
	if x.setState != "" {
		c.cte("st", strings.ReplaceAll(sqlSetRunState, "$2", c.param(string(x.setState)))+"\nRETURNING 1")
	}
	if len(writes) > 0 {
		n := len(writes)
		pos, attempts := make([]int32, n), make([]int32, n)
		keys, kinds, states, errs, childIDs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		outputs := make([]*string, n)
		wakeAts := make([]*time.Time, n)
		delays := make([]*int64, n)
		for i, w := range writes {
			s := w.row
			pos[i], keys[i], kinds[i], states[i], errs[i], childIDs[i] = int32(s.position), s.key, s.kind, s.state, s.errMsg, s.childID
			attempts[i] = int32(w.attempts)
			if s.output != "" {
				outputs[i] = &s.output
			}
			wakeAts[i] = w.wakeAt
			if w.wakeAt == nil && w.delay >= 0 {
				us := w.delay.Microseconds()
				delays[i] = &us
			}
		}
		r := strings.NewReplacer("$2", c.param(pos), "$3", c.param(keys), "$4", c.param(kinds), "$5", c.param(states),
			"$6", c.param(outputs), "$7", c.param(errs), "$8", c.param(attempts), "$9", c.param(wakeAts),
			"$10", c.param(delays), "$11", c.param(childIDs))
		c.cte("s", r.Replace(sqlInsertSteps))
	}
	if fin != nil {
		r := strings.NewReplacer("$2", c.param(string(fin.state)), "$3", c.param(fin.output), "$4", c.param(fin.msg))
		c.cte("f", r.Replace(sqlFinishRootRun))
	}
	var b strings.Builder
	if len(c.ctes) > 0 {
		b.WriteString("WITH ")
		b.WriteString(strings.Join(c.ctes, ",\n"))
		b.WriteString("\n")
	}
	b.WriteString("SELECT " + cancel)
	switch {
	case lease != nil:
		// core.LeaseCheck's function, with this statement's parameters.
		b.WriteString(", relay_hold_lease(" + c.param(lease[0]) + ", " + c.param(lease[1]) + "::uuid) IS NULL")
	case bound != "":
		b.WriteString(", set_config('idle_in_transaction_session_timeout', " + c.param(bound) + ", true) IS NOT NULL")
	default:
		b.WriteString(", true")
	}
	if len(c.names) > 0 {
		b.WriteString("\nFROM ")
		for i, n := range c.names {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(SELECT count(*) FROM " + n + ") AS " + n + "_n")
		}
	}
	return b.String(), c.args, true
}
