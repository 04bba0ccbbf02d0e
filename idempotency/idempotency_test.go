package idempotency_test

import (
	"context"
	"errors"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/idempotency"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T) *pgxpool.Pool {
	pool := testdb.New(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE ledger (order_id text, amount int)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// credit writes a ledger row through Once in its own transaction.
func credit(ctx context.Context, pool *pgxpool.Pool, order string, ran *atomic.Int32, hold <-chan struct{}) (int, bool, error) {
	var res int
	var replayed bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, replayed, err = idempotency.Once(ctx, tx, "ledger", order, func(ctx context.Context) (int, error) {
			ran.Add(1)
			if hold != nil {
				<-hold
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 42)`, order)
			return 42, err
		}, nil)
		return err
	})
	return res, replayed, err
}

func TestOnceRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	for i, wantReplayed := range []bool{false, true, true} {
		res, replayed, err := credit(ctx, pool, "o-1", &ran, nil)
		if err != nil || res != 42 || replayed != wantReplayed {
			t.Fatalf("call %d: %d %v %v", i, res, replayed, err)
		}
	}
	if ran.Load() != 1 || count(t, pool, `SELECT count(*) FROM ledger`) != 1 {
		t.Fatalf("fn ran %d times, %d ledger rows", ran.Load(), count(t, pool, `SELECT count(*) FROM ledger`))
	}

	// A failing fn leaves no key: the next call runs.
	boom := errors.New("boom")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := idempotency.Once(ctx, tx, "ledger", "o-2", func(context.Context) (int, error) { return 0, boom }, nil)
		return err
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing fn: %v", err)
	}
	if _, replayed, err := credit(ctx, pool, "o-2", &ran, nil); err != nil || replayed {
		t.Fatalf("after a failure: replayed=%v %v", replayed, err)
	}

	// A rolled-back transaction leaves no key either.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := idempotency.Once(ctx, tx, "ledger", "o-3", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'o-3'`); n != 0 {
		t.Errorf("rolled-back key is stored")
	}
}

// Two concurrent calls with one key: the second waits for the first's
// transaction, then replays; if the first rolls back, the second runs.
func TestOnceConcurrentSameKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		order := "commit"
		if !commit {
			order = "rollback"
		}
		var ran atomic.Int32
		hold := make(chan struct{})
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		firstDone := make(chan error, 1)
		go func() {
			_, _, err := idempotency.Once(ctx, tx, "ledger", order, func(ctx context.Context) (int, error) {
				ran.Add(1)
				<-hold
				_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 42)`, order)
				return 42, err
			}, nil)
			firstDone <- err
		}()
		waitFor(t, "the first call to run", func() bool { return ran.Load() == 1 })

		type out struct {
			replayed bool
			err      error
		}
		second := make(chan out, 1)
		go func() {
			_, replayed, err := credit(ctx, pool, order, &ran, nil)
			second <- out{replayed, err}
		}()
		waitFor(t, "the second call to wait on the key", func() bool {
			return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%relay_idempotency_keys%'`) == 1
		})
		close(hold)
		if err := <-firstDone; err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			tx.Rollback(ctx)
		}
		got := <-second
		if got.err != nil || got.replayed != commit {
			t.Errorf("%s: second call replayed=%v err=%v; want replayed=%v", order, got.replayed, got.err, commit)
		}
		if want := map[bool]int32{true: 1, false: 2}[commit]; ran.Load() != want {
			t.Errorf("%s: fn ran %d times, want %d", order, ran.Load(), want)
		}
		if n := count(t, pool, `SELECT count(*) FROM ledger WHERE order_id = $1`, order); n != 1 {
			t.Errorf("%s: %d ledger rows, want 1", order, n)
		}
	}
}

func TestExternal(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// The lease must outlast the steps below that count on it (the second
	// attempt during the crashed one's lease; each result's recording,
	// bounded by the lease): 300ms is too short on a loaded machine.
	opts := &idempotency.Options{Lease: 3 * time.Second}
	var tokens []string
	send := func(ctx context.Context, token string) (string, error) {
		tokens = append(tokens, token)
		return "msg-" + token[:8], nil
	}

	// Success, then replays without calling.
	res, replayed, err := idempotency.External(ctx, pool, "email", "receipt-1", send, opts)
	if err != nil || replayed {
		t.Fatalf("first: %v %v", replayed, err)
	}
	res2, replayed, err := idempotency.External(ctx, pool, "email", "receipt-1", send, opts)
	if err != nil || !replayed || res2 != res || len(tokens) != 1 {
		t.Fatalf("second: %q %v %v, %d calls", res2, replayed, err, len(tokens))
	}

	// The crash window: the call is made, then the process dies before the
	// result is recorded (here: the function panics). While the lease
	// lives, another attempt is told the key is in progress; after it, the
	// call runs again with the same token.
	func() {
		defer func() { recover() }()
		idempotency.External(ctx, pool, "email", "receipt-2", func(ctx context.Context, token string) (string, error) {
			tokens = append(tokens, token)
			panic("crash after the call")
		}, opts)
	}()
	if _, _, err := idempotency.External(ctx, pool, "email", "receipt-2", send, opts); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("during the lease: %v, want ErrInProgress", err)
	}
	waitFor(t, "the lease to expire", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'receipt-2' AND lease_expires_at < now()`) == 1
	})
	if _, replayed, err := idempotency.External(ctx, pool, "email", "receipt-2", send, opts); err != nil || replayed {
		t.Fatalf("after the lease: %v %v", replayed, err)
	}
	if len(tokens) != 3 || tokens[1] != tokens[2] || tokens[1] == tokens[0] {
		t.Fatalf("tokens %v: the retry after the crash must reuse the crashed attempt's token", tokens)
	}

	// A failed call lets the next attempt go at once, same token.
	fail := errors.New("provider down")
	if _, _, err := idempotency.External(ctx, pool, "email", "receipt-3", func(ctx context.Context, token string) (string, error) {
		tokens = append(tokens, token)
		return "", fail
	}, opts); !errors.Is(err, fail) {
		t.Fatal(err)
	}
	if _, _, err := idempotency.External(ctx, pool, "email", "receipt-3", send, opts); err != nil {
		t.Fatalf("retry after a failure: %v", err)
	}
	if tokens[3] != tokens[4] {
		t.Errorf("retry after a failure used a new token")
	}

	// Expired keys are forgotten (a fresh token) and deleted in batches.
	if _, err := pool.Exec(ctx, `UPDATE relay_idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'receipt-1'`); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := idempotency.External(ctx, pool, "email", "receipt-1", send, opts); err != nil || replayed {
		t.Fatalf("expired key: %v %v", replayed, err)
	}
	if tokens[len(tokens)-1] == tokens[0] {
		t.Errorf("an expired key kept its token")
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := idempotency.DeleteExpired(ctx, pool, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n < 2 {
			break
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys`); n != 0 {
		t.Errorf("%d keys left after DeleteExpired", n)
	}
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var calls atomic.Int32
	block := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "slow") {
			<-block
		}
		if strings.Contains(string(body), "fail") {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created "+string(body)+" #"+string(rune('0'+n)))
	})
	srv := httptest.NewServer(idempotency.Middleware(pool, nil)(mux))
	defer srv.Close()
	post := func(key, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	r1, b1 := post("k1", "book")
	r2, b2 := post("k1", "book")
	if r1.StatusCode != 201 || r2.StatusCode != 201 || b1 != b2 || calls.Load() != 1 {
		t.Fatalf("replay: %d %q / %d %q, %d calls", r1.StatusCode, b1, r2.StatusCode, b2, calls.Load())
	}
	if r2.Header.Get(idempotency.HeaderReplayed) != "true" || r2.Header.Get("Location") != "/orders/1" {
		t.Errorf("replayed headers: %v", r2.Header)
	}
	r3, b3 := post("k1", "a different book")
	if r3.StatusCode != http.StatusUnprocessableEntity || r3.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(b3, "different request") {
		t.Errorf("same key, other body: %d %s %q", r3.StatusCode, r3.Header.Get("Content-Type"), b3)
	}
	post("", "book")
	post("", "book")
	if calls.Load() != 3 {
		t.Errorf("requests without a key must pass through: %d calls", calls.Load())
	}
	// A 5xx is not stored: the retry runs.
	post("k2", "fail")
	post("k2", "fail")
	if calls.Load() != 5 {
		t.Errorf("5xx was replayed: %d calls", calls.Load())
	}
	// While the first runs, a repeat is told to wait.
	done := make(chan struct{})
	go func() { post("k3", "slow"); close(done) }()
	waitFor(t, "the slow request to hold its key", func() bool { return calls.Load() == 6 })
	r4, _ := post("k3", "slow")
	if r4.StatusCode != http.StatusConflict || r4.Header.Get("Retry-After") == "" {
		t.Errorf("in progress: %d, Retry-After %q", r4.StatusCode, r4.Header.Get("Retry-After"))
	}
	// A different request with the key in use is refused as different, not
	// told to wait for a response it could never replay.
	if r, b := post("k3", "slow, another book"); r.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(b, "different request") {
		t.Errorf("in progress, other body: %d %q; want 422", r.StatusCode, b)
	}
	close(block)
	<-done
	if r5, _ := post("k3", "slow"); r5.StatusCode != 201 || calls.Load() != 6 {
		t.Errorf("after the slow one finished: %d, %d calls", r5.StatusCode, calls.Load())
	}
}

func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); testdb.WaitFor(t, what, cond) }

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return testdb.Count(t, pool, sql, args...)
}

// A handler that panics releases its key (the panic goes on to the
// server): the retry runs instead of getting 409 for the whole lease.
func TestMiddlewarePanicReleasesKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var calls atomic.Int32
	h := idempotency.Middleware(pool, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			panic("handler bug")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	serve := func() (rec *httptest.ResponseRecorder, panicked any) {
		defer func() { panicked = recover() }()
		req := httptest.NewRequest("POST", "/orders", strings.NewReader("book"))
		req.Header.Set(idempotency.HeaderKey, "p1")
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, nil
	}
	if _, p := serve(); p != "handler bug" {
		t.Fatalf("panic not passed on: %v", p)
	}
	rec, p := serve()
	if p != nil || rec.Code != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("retry after a panic: %d (panic %v), %d calls; want 201 from a second run", rec.Code, p, calls.Load())
	}
}

// A key's expiry never comes before its lease ends, and a live lease always
// wins: with a TTL far shorter than the lease, a second caller during the
// first call is told it is in progress — never handed the key (and a fresh
// token) to make the call a second time at once.
func TestExternalLeaseOutlivesTTL(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	opts := &idempotency.Options{TTL: 10 * time.Millisecond, Lease: time.Minute}
	var calls atomic.Int32
	inCall, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, _, err := idempotency.External(ctx, pool, "payments", "charge-1", func(ctx context.Context, token string) (string, error) {
			calls.Add(1)
			close(inCall)
			<-release
			return "ch_1", nil
		}, opts)
		first <- err
	}()
	<-inCall
	waitFor(t, "the TTL to pass", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'charge-1' AND created_at + interval '50 ms' < now()`) == 1
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'charge-1' AND expires_at >= lease_expires_at`); n != 1 {
		t.Errorf("the key expires before its lease ends")
	}
	if _, err := idempotency.DeleteExpired(ctx, pool, 100); err != nil {
		t.Fatal(err)
	}
	_, _, err := idempotency.External(ctx, pool, "payments", "charge-1", func(ctx context.Context, token string) (string, error) {
		calls.Add(1)
		return "ch_2", nil
	}, opts)
	if !errors.Is(err, idempotency.ErrInProgress) || calls.Load() != 1 {
		t.Fatalf("second caller during the first call: %v, %d calls; want ErrInProgress and one call", err, calls.Load())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// Expired keys go away without anyone calling DeleteExpired: External
// sweeps a bounded batch now and then as new keys arrive, in its own key
// transaction.
func TestExpiredKeysAreSweptByTheHelpers(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_idempotency_keys (scope, key, status, result, expires_at)
		SELECT 'old', 'k' || i, 'succeeded', '1', now() - interval '1 hour' FROM generate_series(1, 300) i`); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if _, _, err := idempotency.External(ctx, pool, "mail", "order-"+strconv.Itoa(i), func(context.Context, string) (int, error) {
			return 1, nil
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE scope = 'old'`); n != 0 {
		t.Errorf("%d of 300 expired keys left after 300 new keys", n)
	}
}

// sweepingKey is a key whose arrival makes the helpers sweep (one in 16, by
// an FNV-1a hash of the key).
func sweepingKey(t *testing.T) string {
	for i := 0; ; i++ {
		k := "order-" + strconv.Itoa(i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%16 == 0 {
			return k
		}
	}
}

// Once writes only its own key in the caller's transaction: it deletes no
// expired key there, even for a key that makes the other helpers sweep. A
// caller at REPEATABLE READ whose snapshot predates another transaction's
// change to an expired key got a serialization failure from that sweep,
// over a row it never asked for.
func TestOnceLeavesOtherKeysAlone(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_idempotency_keys (scope, key, status, result, expires_at)
		SELECT 'old', 'k' || i, 'succeeded', '1', now() - interval '1 hour' FROM generate_series(1, 20) i`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM ledger`); err != nil { // the caller's snapshot
		t.Fatal(err)
	}
	// Another process touches the expired keys after that snapshot.
	if _, err := pool.Exec(ctx, `UPDATE relay_idempotency_keys SET updated_at = now() WHERE scope = 'old'`); err != nil {
		t.Fatal(err)
	}
	key := sweepingKey(t)
	if _, _, err := idempotency.Once(ctx, tx, "ledger", key, func(ctx context.Context) (int, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 42)`, key)
		return 42, err
	}, nil); err != nil {
		t.Fatalf("Once at REPEATABLE READ: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE scope = 'old'`); n != 20 {
		t.Errorf("%d of 20 expired keys left; Once must not delete other keys in its caller's transaction", n)
	}
}

// A Cleaner empties the expired keys in bounded batches without any new
// key arriving, and leaves live ones.
func TestCleaner(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_idempotency_keys (scope, key, status, result, expires_at)
		SELECT 'old', 'k' || i, 'succeeded', '1'::jsonb, now() - interval '1 hour' FROM generate_series(1, 250) i
		UNION ALL SELECT 'live', 'k', 'succeeded', '1', now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	c, err := idempotency.NewCleaner(pool, &idempotency.CleanerConfig{BatchSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	waitFor(t, "the expired keys to go", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE scope = 'old'`) == 0
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE scope = 'live'`); n != 1 {
		t.Errorf("the cleaner deleted a live key")
	}
}

// The request is compared before anything else: a different request with
// a key whose lease has run out (the first still running past it, or
// crashed) is refused with 422 — it does not take the key over and run.
func TestMiddlewareDifferentRequestNeverTakesOver(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var calls atomic.Int32
	block := make(chan struct{})
	h := idempotency.Middleware(pool, &idempotency.MiddlewareOptions{Lease: 50 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if string(body) == "slow" {
			<-block
		}
		w.WriteHeader(http.StatusCreated)
	}))
	serve := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		req.Header.Set(idempotency.HeaderKey, "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	done := make(chan struct{})
	go func() { defer close(done); serve("slow") }()
	waitFor(t, "the first request's lease to run out", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'k' AND lease_expires_at < now()`) == 1
	})
	if rec := serve("another book"); rec.Code != http.StatusUnprocessableEntity || calls.Load() != 1 {
		t.Errorf("different request, lease run out: %d, %d handler calls; want 422 and the handler not run", rec.Code, calls.Load())
	}
	close(block)
	<-done
}

// stallingPool is a pool on the test database whose acquisitions hang
// (until their context ends) once stall is set: a database that stopped
// answering after the key was taken.
func stallingPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *atomic.Bool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	var stall atomic.Bool
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if stall.Load() {
			<-ctx.Done()
			return true, ctx.Err()
		}
		return true, nil
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, &stall
}

// Recording a key after the call waits for the database at most the lease:
// External and the middleware return (External with the error) instead of
// hanging when the database stops answering mid-call.
func TestRecordingIsBoundedByTheLease(t *testing.T) {
	t.Parallel()
	pool, stall := stallingPool(t, setup(t))
	opts := &idempotency.Options{Lease: 300 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		_, _, err := idempotency.External(context.Background(), pool, "s", "k", func(ctx context.Context, token string) (int, error) {
			stall.Store(true)
			return 1, nil
		}, opts)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("External reported the key recorded on a database that does not answer")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("External hung recording the key")
	}

	stall.Store(false)
	h := idempotency.Middleware(pool, &idempotency.MiddlewareOptions{Lease: 300 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stall.Store(true)
		w.WriteHeader(http.StatusCreated)
	}))
	served := make(chan int, 1)
	go func() {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader("book"))
		req.Header.Set(idempotency.HeaderKey, "m")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		served <- rec.Code
	}()
	select {
	case code := <-served:
		if code != http.StatusCreated {
			t.Errorf("middleware answered %d; want the handler's 201", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the middleware hung recording the response")
	}
}

// A key's TTL counts from its last attempt: a failed attempt that ends
// after the key's first expiry keeps it (and its token) for another TTL,
// so the sweep cannot delete it before the retry, which would then call the
// service with a fresh token.
func TestFailedAttemptKeepsTheTokenForATTL(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// The lease is shorter than the TTL (so the key's first expiry is the
	// TTL's) and bounds the failure's recording: 200ms could be missed on a
	// loaded machine, the key then expiring with its token.
	opts := &idempotency.Options{TTL: 3 * time.Second, Lease: 2 * time.Second}
	var first string
	_, _, err := idempotency.External(ctx, pool, "payments", "charge-9", func(ctx context.Context, token string) (string, error) {
		first = token
		waitFor(t, "the key's first expiry", func() bool {
			return count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'charge-9' AND created_at + interval '3.2 s' < now()`) == 1
		})
		return "", errors.New("gateway timeout")
	}, opts)
	if err == nil {
		t.Fatal("the failing call succeeded")
	}
	if _, err := idempotency.DeleteExpired(ctx, pool, 100); err != nil {
		t.Fatal(err)
	}
	var second string
	if _, _, err := idempotency.External(ctx, pool, "payments", "charge-9", func(ctx context.Context, token string) (string, error) {
		second = token
		return "ch_9", nil
	}, opts); err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("the retry got token %s, the first attempt %s; want the same", second, first)
	}
}
