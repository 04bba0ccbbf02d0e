package core

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

// batchTracer records the number of ids of every fenced batch write on a
// pool, and holds the first one until release is closed.
type batchTracer struct {
	mu      sync.Mutex
	sizes   []int
	started chan struct{} // closed when the first batch write starts
	release chan struct{}
	written chan struct{} // a value after each batch write
}

func (b *batchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "locked AS (") || len(d.Args) == 0 {
		return ctx
	}
	ids, _ := d.Args[0].([]int64)
	b.mu.Lock()
	b.sizes = append(b.sizes, len(ids))
	first := len(b.sizes) == 1
	b.mu.Unlock()
	if first {
		close(b.started)
		<-b.release
	}
	return context.WithValue(ctx, b, true)
}

func (b *batchTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(b) != nil {
		b.written <- struct{}{}
	}
}

func (b *batchTracer) batches() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

// Outcomes that arrive while a batch is being written wait for company, as
// a fresh small batch does, instead of going out at once as the next
// batch: under a steady load the immediate write made every other batch a
// small one (about 5.6 jobs per completion statement at 1,000 jobs/s with
// a 10 ms window, half of them the leftovers of a write). Here a release
// (which keeps the short wait) is held in its write while two successes
// arrive; a third success comes after the write ended, and all three share
// the next statement.
func TestCompleterGathersWhatCameDuringAWrite(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	cfg := pool.Config()
	tr := &batchTracer{started: make(chan struct{}), release: make(chan struct{}), written: make(chan struct{}, 8)}
	cfg.ConnConfig.Tracer = tr
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()

	q := floorQueue(pool, "completer-gather")
	c := q.client
	c.outcomes = traced
	c.hardCtx = ctx // the release wakes its queue (notifyQueues)
	if c.metrics, err = newMetrics(c); err != nil {
		t.Fatal(err)
	}
	p := c.completer
	p.quiet = time.Hour // nothing but a full batch or Stop ends the successes' wait
	for range 4 {
		enqueueFloor(t, pool, EnqueueOpts{Queue: q.name})
	}
	rows, err := q.claim(ctx, 10, nil)
	if err != nil || len(rows) != 4 {
		t.Fatalf("claim: %d rows, %v; want 4", len(rows), err)
	}
	go p.run()

	p.add(outcome{row: rows[0], kind: outcomeRelease})
	select {
	case <-tr.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the release was not written within 30 s")
	}
	p.add(outcome{row: rows[1], kind: outcomeSuccess})
	p.add(outcome{row: rows[2], kind: outcomeSuccess})
	close(tr.release)
	<-tr.written
	// Written at once, the two successes would go now, alone.
	select {
	case <-tr.written:
		t.Fatalf("the successes that arrived during the release's write were written at once: batches %v", tr.batches())
	case <-time.After(200 * time.Millisecond):
	}
	p.add(outcome{row: rows[3], kind: outcomeSuccess})
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if left := p.stop(stopCtx); left != 0 {
		t.Fatalf("stop left %d outcomes unwritten", left)
	}
	if got := tr.batches(); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("batch sizes %v, want [1 3]: the release, then the three successes together", got)
	}
	if n := c.stats.succeeded.Load(); n != 3 {
		t.Fatalf("%d successes recorded, want 3", n)
	}
}
