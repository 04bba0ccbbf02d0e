package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitCounts counts what PostgreSQL's backends were doing when sampled:
// per "type:event" (pg_stat_activity's wait_event_type and wait_event;
// "CPU" for an active backend waiting on nothing), over a number of
// samples.
type WaitCounts struct {
	Samples int
	Events  map[string]int
}

func (w *WaitCounts) add(o WaitCounts) {
	w.Samples += o.Samples
	if w.Events == nil {
		w.Events = map[string]int{}
	}
	for k, n := range o.Events {
		w.Events[k] += n
	}
}

// String lists the events, most frequent first, each with its count and
// the mean number of backends in it per sample.
func (w WaitCounts) String() string {
	type ev struct {
		name string
		n    int
	}
	evs := make([]ev, 0, len(w.Events))
	for k, n := range w.Events {
		evs = append(evs, ev{k, n})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].n > evs[j].n || evs[i].n == evs[j].n && evs[i].name < evs[j].name })
	var b strings.Builder
	fmt.Fprintf(&b, "%d samples:", w.Samples)
	for i, e := range evs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %d (%.2f)", e.name, e.n, float64(e.n)/float64(max(w.Samples, 1)))
	}
	return b.String()
}

// sqlWaits is one sample: every client backend running a statement, and
// every other process (autovacuum, the WAL writer, the checkpointer) that
// is waiting on something other than its idle loop, by what it waits on.
// A client backend's event is prefixed with nothing, another process's
// with its backend_type.
const sqlWaits = `
	SELECT CASE WHEN backend_type = 'client backend' THEN '' ELSE backend_type || ' ' END
	       || coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)
	FROM pg_stat_activity
	WHERE pid <> pg_backend_pid()
	  AND (backend_type = 'client backend' AND state = 'active'
	       OR backend_type <> 'client backend' AND coalesce(wait_event_type, '') <> 'Activity')
	GROUP BY 1`

// SampleWaits samples pg_stat_activity every interval on a connection of
// its own until ctx is done, and prints the counts of each window (of
// windows after began, as the steady run's windows are) and of the whole
// run to out. A failed sample is counted as missing, not retried.
func SampleWaits(ctx context.Context, pool *pgxpool.Pool, began time.Time, interval, window time.Duration, out io.Writer) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		fmt.Fprintf(out, "  waits: %v\n", err)
		return
	}
	defer conn.Release()
	var total, cur WaitCounts
	failed := 0
	next := began.Add(window)
	flush := func(end time.Time) {
		fmt.Fprintf(out, "  waits +%s: %s\n", end.Sub(began).Round(time.Second), cur)
		total.add(cur)
		cur = WaitCounts{}
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if cur.Samples > 0 {
				flush(time.Now())
			}
			fmt.Fprintf(out, "bench: waits over the run (%d samples failed): %s\n", failed, total)
			return
		case <-tick.C:
		}
		for now := time.Now(); !now.Before(next); next = next.Add(window) {
			flush(next)
		}
		s := WaitCounts{Samples: 1, Events: map[string]int{}}
		rows, err := conn.Query(ctx, sqlWaits)
		if err == nil {
			for rows.Next() {
				var k string
				var n int
				if err = rows.Scan(&k, &n); err != nil {
					break
				}
				s.Events[k] += n
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil {
			if ctx.Err() == nil {
				failed++
			}
			continue
		}
		cur.add(s)
	}
}
