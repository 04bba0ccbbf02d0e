package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Hops: where a latency call's time goes, hop by hop (WorkflowSpec.Hops).
// A diagnostic mode: the engine records the time of each hop of every
// call it makes (in the caller, in the workflow function and its steps,
// and, read once after the measurement, the database's own timestamps of
// the run), and the result reports each hop's p50 and p99 over the calls
// recorded, and its mean over the slowest 1% of them, the calls the p99
// is made of. The hot path of a measurement without Hops records nothing.

// HopFigure is one hop's figures over the calls of a measurement.
type HopFigure struct {
	Name string        `json:"name"`
	P50  time.Duration `json:"p50"`
	P99  time.Duration `json:"p99"`
	// TailMean is the hop's mean over the calls whose whole time is at or
	// above the whole time's p99.
	TailMean time.Duration `json:"tail_mean"`
	// Missing counts calls for which the hop could not be timed.
	Missing int `json:"missing,omitempty"`
}

// HopReporter is a WorkflowEngine that records hops (WorkflowSpec.Hops):
// Hops returns the figures of the calls that began at or after from and
// ended at or before to.
type HopReporter interface {
	Hops(ctx context.Context, from, to time.Time) ([]HopFigure, error)
}

// hopCall is the times of one call, marks[i] that of point i of the
// engine's points (zero: not seen).
type hopCall struct {
	runID string
	marks []time.Time
}

// hopLog collects calls' marks: in the caller's goroutine (the call's own
// points) and in the run's execution (the points inside the workflow).
type hopLog struct {
	points []string // the names of the points, in order

	mu    sync.Mutex
	byRun map[string]*hopCall
	calls []*hopCall
}

func newHopLog(points ...string) *hopLog {
	return &hopLog{points: points, byRun: map[string]*hopCall{}}
}

func (l *hopLog) index(point string) int {
	i := slices.Index(l.points, point)
	if i < 0 {
		panic("bench: unknown hop point " + point)
	}
	return i
}

// call returns the record of run id, made on first use.
func (l *hopLog) call(id string) *hopCall {
	c := l.byRun[id]
	if c == nil {
		c = &hopCall{runID: id, marks: make([]time.Time, len(l.points))}
		l.byRun[id] = c
	}
	return c
}

// mark records point of run id at t, once (a replay's second pass through
// a point keeps the first time).
func (l *hopLog) mark(id, point string, t time.Time) {
	i := l.index(point)
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.call(id); c.marks[i].IsZero() {
		c.marks[i] = t
	}
}

// done records that run id's call ended (its last point marked): only
// calls that ended are reported.
func (l *hopLog) done(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, l.call(id))
	delete(l.byRun, id)
}

// figures computes the hops between consecutive points of the calls that
// began (first point) at or after from and ended (last point) at or
// before to. A point not seen is skipped: its hop is folded into the next
// one seen, and counted missing.
func (l *hopLog) figures(from, to time.Time) []HopFigure {
	l.mu.Lock()
	var calls []*hopCall
	for _, c := range l.calls {
		first, last := c.marks[0], c.marks[len(c.marks)-1]
		if !first.IsZero() && !last.IsZero() && !first.Before(from) && !last.After(to) {
			calls = append(calls, c)
		}
	}
	l.mu.Unlock()
	n := len(l.points)
	hists := make([]Histogram, n) // hists[i]: point i-1 → i; hists[0]: the whole call
	whole := make([]time.Duration, len(calls))
	missing := make([]int, n)
	for k, c := range calls {
		whole[k] = c.marks[n-1].Sub(c.marks[0])
		hists[0].Record(whole[k])
		prev := c.marks[0]
		for i := 1; i < n; i++ {
			if c.marks[i].IsZero() {
				missing[i]++
				continue
			}
			hists[i].Record(max(c.marks[i].Sub(prev), 0))
			prev = c.marks[i]
		}
	}
	cut := hists[0].Quantile(0.99)
	tail := make([]time.Duration, n)
	tailN := make([]int, n)
	for k, c := range calls {
		if whole[k] < cut {
			continue
		}
		tail[0] += whole[k]
		tailN[0]++
		prev := c.marks[0]
		for i := 1; i < n; i++ {
			if c.marks[i].IsZero() {
				continue
			}
			tail[i] += max(c.marks[i].Sub(prev), 0)
			tailN[i]++
			prev = c.marks[i]
		}
	}
	out := make([]HopFigure, n)
	for i := range n {
		name := "whole call"
		if i > 0 {
			name = l.points[i-1] + " → " + l.points[i]
		}
		out[i] = HopFigure{Name: name, P50: hists[i].Quantile(0.5), P99: hists[i].Quantile(0.99), Missing: missing[i]}
		if tailN[i] > 0 {
			out[i].TailMean = tail[i] / time.Duration(tailN[i])
		}
	}
	return out
}

// HopsTable renders a result's hops, one line each ("" when it has none).
func (r WorkflowResult) HopsTable() string {
	if len(r.Hops) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  hops of %s, %d callers (ms)     p50      p99   mean of the slowest 1%%\n", r.System, r.Spec.Callers)
	for _, h := range r.Hops {
		fmt.Fprintf(&b, "  %-34s %8s %8s %8s", h.Name, ms(h.P50), ms(h.P99), ms(h.TailMean))
		if h.Missing > 0 {
			fmt.Fprintf(&b, "   (%d calls without this point)", h.Missing)
		}
		b.WriteString("\n")
	}
	return b.String()
}
