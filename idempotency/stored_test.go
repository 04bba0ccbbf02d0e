package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/idempotency"
)

// A stored result of another shape (written behind the helpers) fails the
// calls with its own key only, with ErrStoredResult naming the key and the
// decode error, and without running the effect again; a key beside it
// replays as usual.
func TestUndecodableStoredResultFailsItsKeyOnly(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	for _, order := range []string{"o-bad", "o-good"} {
		if _, _, err := credit(ctx, pool, order, &ran, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := idempotency.External(ctx, pool, "mail", order, func(context.Context, string) (int, error) {
			ran.Add(1)
			return 7, nil
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_idempotency_keys SET result = '"text"' WHERE key = 'o-bad'`); err != nil {
		t.Fatal(err)
	}
	ran.Store(0)
	for range 2 {
		_, _, err := credit(ctx, pool, "o-bad", &ran, nil)
		if !errors.Is(err, idempotency.ErrStoredResult) || !strings.Contains(err.Error(), "ledger/o-bad") || !strings.Contains(err.Error(), "cannot unmarshal string") {
			t.Errorf("Once with the bad key: %v; want ErrStoredResult naming the key and the decode error", err)
		}
		_, _, err = idempotency.External(ctx, pool, "mail", "o-bad", func(context.Context, string) (int, error) {
			ran.Add(1)
			return 7, nil
		}, nil)
		if !errors.Is(err, idempotency.ErrStoredResult) || !strings.Contains(err.Error(), "mail/o-bad") {
			t.Errorf("External with the bad key: %v; want ErrStoredResult naming the key", err)
		}
	}
	if res, replayed, err := credit(ctx, pool, "o-good", &ran, nil); err != nil || !replayed || res != 42 {
		t.Errorf("Once with the good key: %d, %v, %v; want the replayed 42", res, replayed, err)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("the effect ran %d times again; a stored result that does not decode must not run it", n)
	}
	// Deleting the key (as the admin API does) lets the effect run again.
	if _, err := pool.Exec(ctx, `DELETE FROM relay_idempotency_keys WHERE scope = 'ledger' AND key = 'o-bad'`); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := credit(ctx, pool, "o-bad", &ran, nil); err != nil || replayed || ran.Load() != 1 {
		t.Errorf("after deleting the key: replayed %v, %v, ran %d; want it run once", replayed, err, ran.Load())
	}
}

// The middleware's stored rows: a stored response of another shape fails
// that key's requests (500, the key logged once per request), a stored
// request fingerprint that matches nothing refuses that key's requests
// (422); the handler never runs for either, and other keys are served.
func TestUndecodableStoredResponseFailsItsKeyOnly(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var calls atomic.Int32
	logs := &lockedBuffer{}
	h := idempotency.Middleware(pool, &idempotency.MiddlewareOptions{
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	post := func(key string) int {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader("book"))
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, k := range []string{"bad-response", "bad-hash", "good"} {
		if code := post(k); code != http.StatusCreated {
			t.Fatalf("first request with %s: %d", k, code)
		}
	}
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `UPDATE relay_idempotency_keys SET result = '[1]' WHERE key = 'bad-response'`); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), `UPDATE relay_idempotency_keys SET request_hash = 'not-a-hash' WHERE key = 'bad-hash'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	calls.Store(0)
	if code := post("bad-response"); code != http.StatusInternalServerError {
		t.Errorf("stored response of another shape: %d; want 500", code)
	}
	if code := post("bad-hash"); code != http.StatusUnprocessableEntity {
		t.Errorf("stored fingerprint that matches nothing: %d; want 422", code)
	}
	if code := post("good"); code != http.StatusCreated {
		t.Errorf("the good key: %d; want its replayed 201", code)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times; want 0 (every key was stored)", n)
	}
	out := logs.String()
	if strings.Count(out, "stored response unreadable") != 1 || !strings.Contains(out, "key=bad-response") {
		t.Errorf("log: %s; want one line naming the key", out)
	}
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
