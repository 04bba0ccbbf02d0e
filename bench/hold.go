package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Window is the pickup latency of the jobs inserted in one window of a
// steady run (Steady.Window).
type Window struct {
	Start    time.Time // the window's start (insert time)
	Jobs     uint64
	P50, P99 time.Duration
	Max      time.Duration // the upper bound of the slowest bucket's value
}

// windows lists the merged per-window histograms, oldest first.
func (f *fleet) windows(size time.Duration) []Window {
	var out []Window
	for w, h := range f.win {
		out = append(out, Window{Start: time.Unix(0, w*int64(size)), Jobs: h.Count(),
			P50: h.Quantile(0.5), P99: h.Quantile(0.99), Max: h.Quantile(1)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// HoldXmin is an idle-in-transaction session holding back the xmin
// horizon, as a forgotten psql session or a stuck application transaction
// does: from at after began it opens a transaction, takes a transaction id
// and a snapshot (it reads a row of table), then sits idle for hold and
// rolls back. While it holds, no row version deleted or updated after its
// start can be removed by VACUUM, nor its index entries marked dead by a
// scan (kill_prior_tuple needs the tuple dead to every snapshot). It
// reports on out when it took and released the horizon; the times are
// returned for the caller to label windows with.
func HoldXmin(ctx context.Context, pool *pgxpool.Pool, table string, began time.Time, at, hold time.Duration, out io.Writer) (from, to time.Time, err error) {
	if err := sleepCtx(ctx, time.Until(began.Add(at))); err != nil {
		return from, to, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return from, to, fmt.Errorf("hold xmin: %w", err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return from, to, fmt.Errorf("hold xmin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var xid int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
		return from, to, fmt.Errorf("hold xmin: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+table+` LIMIT 1`); err != nil {
		return from, to, fmt.Errorf("hold xmin: %w", err)
	}
	from = time.Now()
	fmt.Fprintf(out, "  holder: idle in transaction (xid %d) from +%s, for %s\n", xid, from.Sub(began).Round(time.Second), hold)
	if err := sleepCtx(ctx, hold); err != nil {
		return from, to, err
	}
	if err := tx.Rollback(ctx); err != nil {
		return from, to, fmt.Errorf("hold xmin: release: %w", err)
	}
	to = time.Now()
	fmt.Fprintf(out, "  holder: released at +%s\n", to.Sub(began).Round(time.Second))
	return from, to, nil
}
