package core_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/netfault"
	"github.com/relayq/relay/testkit/testdb"
)

type heldArgs struct{ N int }

func (heldArgs) Kind() string { return "held" }

// holder runs heldArgs jobs that each wait until released by job id or
// until their context ends; ends records each job's context cause (nil
// when released) and when it came.
type holder struct {
	started chan int64
	mu      sync.Mutex
	release map[int64]chan error
	ends    map[int64]holderEnd
}

type holderEnd struct {
	cause error
	at    time.Time
}

func newHolder() (*holder, *core.Workers) {
	h := &holder{started: make(chan int64, 100), release: map[int64]chan error{}, ends: map[int64]holderEnd{}}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error {
		ch := h.ch(j.ID)
		h.started <- j.ID
		select {
		case err := <-ch:
			h.end(j.ID, nil)
			return err
		case <-ctx.Done():
			h.end(j.ID, context.Cause(ctx))
			return ctx.Err()
		}
	}))
	return h, ws
}

func (h *holder) ch(id int64) chan error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.release[id] == nil {
		h.release[id] = make(chan error, 1)
	}
	return h.release[id]
}

func (h *holder) end(id int64, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends[id] = holderEnd{cause, time.Now()}
}

func (h *holder) ended(id int64) (holderEnd, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.ends[id]
	return e, ok
}

// proxied returns a pool on a fresh database reached through a proxy the
// test can cut.
func proxied(t *testing.T, maxConns int32) (*pgxpool.Pool, *pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	url := testdb.URL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Listen(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, direct, p
}

// waitDBTime waits until the database's clock passes t.
func waitDBTime(t *testing.T, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	waitFor(t, "database time "+at.Format(time.RFC3339Nano), func() bool {
		var past bool
		if err := pool.QueryRow(context.Background(), `SELECT now() > $1`, at).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
}

type stormArgs struct{ N int }

func (stormArgs) Kind() string { return "storm" }

type flakyArgs struct{}

func (flakyArgs) Kind() string { return "flaky" }

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
