package bench

import (
	"fmt"
	"testing"
	"time"
)

// Hops are the times between consecutive points of each call, over the
// calls inside the window; a point not seen folds its hop into the next,
// and is counted missing; the slowest 1% are the calls at or above the
// whole call's p99.
func TestHopFigures(t *testing.T) {
	l := newHopLog("call", "middle", "end")
	t0 := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	for i := range 100 {
		id := fmt.Sprint(i)
		at := t0.Add(time.Duration(i) * time.Second)
		mid, end := 2*time.Millisecond, 5*time.Millisecond
		if i == 99 {
			mid, end = 2*time.Millisecond, 50*time.Millisecond // the slowest call: its second hop
		}
		l.mark(id, "call", at)
		if i != 50 {
			l.mark(id, "middle", at.Add(mid))
			l.mark(id, "middle", at.Add(time.Hour)) // a second pass keeps the first time
		}
		l.mark(id, "end", at.Add(end))
		l.done(id)
	}
	l.mark("outside", "call", t0.Add(-time.Second)) // began before the window
	l.mark("outside", "end", t0)
	l.done("outside")
	hops := l.figures(t0, t0.Add(time.Hour))
	if len(hops) != 3 || hops[0].Name != "whole call" || hops[1].Name != "call → middle" || hops[2].Name != "middle → end" {
		t.Fatalf("hops %+v", hops)
	}
	near := func(got, want time.Duration) bool { return got >= want*98/100 && got <= want*102/100 }
	if !near(hops[0].P50, 5*time.Millisecond) || !near(hops[1].P50, 2*time.Millisecond) || !near(hops[2].P50, 3*time.Millisecond) {
		t.Fatalf("p50s %v %v %v", hops[0].P50, hops[1].P50, hops[2].P50)
	}
	if hops[1].Missing != 1 || hops[2].Missing != 0 {
		t.Fatalf("missing %d %d, want 1 0 (call 50 has no middle)", hops[1].Missing, hops[2].Missing)
	}
	if !near(hops[0].TailMean, 50*time.Millisecond) || !near(hops[2].TailMean, 48*time.Millisecond) || !near(hops[1].TailMean, 2*time.Millisecond) {
		t.Fatalf("slowest 1%%: %v %v %v, want 50ms, 2ms, 48ms", hops[0].TailMean, hops[1].TailMean, hops[2].TailMean)
	}
}
