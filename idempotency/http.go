package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/dbx"
)

// HeaderKey is the request header the middleware honours.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on a replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// MiddlewareOptions tune Middleware. The zero value (or nil) is usable.
type MiddlewareOptions struct {
	// Scope names the key space; use one per API. Default "http".
	Scope string
	// TTL is how long a response is kept for replay. Default 24h.
	TTL time.Duration
	// Lease is how long a request holds its key while it runs; a request
	// arriving meanwhile with the same key gets 409. Default 1 minute.
	Lease time.Duration
	// MaxBody is the largest request body accepted with a key (413 above).
	// Default 1 MiB.
	MaxBody int64
	// Logger receives storage errors. Default slog.Default().
	Logger *slog.Logger
}

// storedResponse is a response as kept for replay.
type storedResponse struct {
	Status int                 `json:"status"`
	Header map[string][]string `json:"header"`
	Body   []byte              `json:"body"`
}

// Middleware honours the Idempotency-Key header on the requests it wraps:
//
//   - the first request with a key runs; its response (unless a 5xx) is
//     stored with the key and a fingerprint of the request (method, path,
//     body);
//   - a repeat with the same key and the same request gets the stored
//     response again, with Idempotent-Replayed: true, and the handler does
//     not run — so a client retrying a POST that enqueues a job enqueues it
//     once;
//   - the same key with a different request is refused: 422 (also while the
//     first is still running);
//   - a repeat of the same request while the first is still running is
//     refused: 409, with Retry-After;
//   - a 5xx response is not stored, and a handler that panics releases the
//     key (the panic goes on), so the client may retry.
//
// Requests without the header pass through. Errors are RFC 9457
// application/problem+json. The whole response is buffered (no streaming).
func Middleware(pool *pgxpool.Pool, opts *MiddlewareOptions) func(http.Handler) http.Handler {
	o := MiddlewareOptions{}
	if opts != nil {
		o = *opts
	}
	if o.Scope == "" {
		o.Scope = "http"
	}
	if o.TTL <= 0 {
		o.TTL = 24 * time.Hour
	}
	if o.Lease <= 0 {
		o.Lease = time.Minute
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 1 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(HeaderKey)
			if key == "" {
				next.ServeHTTP(w, r)
				return
			}
			if len(key) > 255 {
				problem(w, http.StatusBadRequest, "Invalid Idempotency-Key", "the Idempotency-Key header must be at most 255 characters")
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, o.MaxBody+1))
			if err != nil {
				problem(w, http.StatusBadRequest, "Unreadable body", err.Error())
				return
			}
			if int64(len(body)) > o.MaxBody {
				problem(w, http.StatusRequestEntityTooLarge, "Body too large", fmt.Sprintf("requests with an Idempotency-Key may carry at most %d bytes", o.MaxBody))
				return
			}
			sum := sha256.Sum256([]byte(r.Method + "\x00" + r.URL.RequestURI() + "\x00" + string(body)))
			hash := hex.EncodeToString(sum[:])

			owner := uuid.New()
			var st state
			var owned bool
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
				var err error
				st, owned, err = acquire(r.Context(), dbx.PGX{Q: tx}, o.Scope, key, owner, o.Lease, o.TTL, hash, true)
				return err
			})
			switch {
			case errors.Is(err, ErrInProgress):
				w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(math.Max(st.leaseLeft, 1)))))
				problem(w, http.StatusConflict, "Request in progress", "a request with this Idempotency-Key is still being processed; retry later")
				return
			case err != nil:
				o.Logger.Error("relay: idempotency middleware: storage failed", "err", err)
				problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "the request was not processed; retry later")
				return
			}
			if !owned {
				// acquire compares the request first: a different one is
				// handed back here whatever the key's state or lease, and is
				// a client error.
				if st.requestHash != hash {
					problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
						"this Idempotency-Key was already used with a different request (method, path or body); use a new key for a new request")
					return
				}
				if st.status != "succeeded" { // acquire hands back running keys only for a different request
					o.Logger.Error("relay: idempotency middleware: key neither owned nor succeeded", "key", key, "status", st.status)
					problem(w, http.StatusInternalServerError, "Idempotency store inconsistent", "the request was not processed")
					return
				}
				var resp storedResponse
				if err := json.Unmarshal(st.result, &resp); err != nil {
					o.Logger.Error("relay: idempotency middleware: stored response unreadable; this key's requests fail until the row is fixed or deleted",
						"scope", o.Scope, "key", key, "err", err)
					problem(w, http.StatusInternalServerError, "Stored response unreadable", "the stored response for this key could not be read")
					return
				}
				for k, vs := range resp.Header {
					w.Header()[k] = vs
				}
				w.Header().Set(HeaderReplayed, "true")
				w.WriteHeader(resp.Status)
				w.Write(resp.Body) //nolint:errcheck
				return
			}

			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := &recorder{header: http.Header{}, status: http.StatusOK}
			// The key is recorded (or released) even if the client went
			// away, but not for longer than the lease: after it, another
			// request may take the key over anyway, and an unresponsive
			// database must not hold the response for ever.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), o.Lease)
			defer cancel()
			func() {
				// A handler that panics made no response to keep: release
				// the key so that a retry runs, then let the panic go on to
				// the server's recovery.
				defer func() {
					if p := recover(); p != nil {
						if _, err := pool.Exec(ctx, sqlForget, o.Scope, key, owner); err != nil {
							o.Logger.Error("relay: idempotency middleware: forget key after panic", "err", err)
						}
						panic(p)
					}
				}()
				next.ServeHTTP(rec, r)
			}()
			if rec.status >= 500 {
				if _, err := pool.Exec(ctx, sqlForget, o.Scope, key, owner); err != nil {
					o.Logger.Error("relay: idempotency middleware: forget key", "err", err)
				}
			} else {
				enc, err := encode(storedResponse{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()})
				if err == nil {
					_, err = pool.Exec(ctx, sqlSucceed, o.Scope, key, owner, enc, o.TTL.Seconds())
				}
				if err != nil {
					// The request's effect happened; a repeat will run it
					// again once the lease ends. Say so in the logs.
					o.Logger.Error("relay: idempotency middleware: response not stored", "key", key, "err", err)
				}
			}
			for k, vs := range rec.header {
				w.Header()[k] = vs
			}
			w.WriteHeader(rec.status)
			w.Write(rec.body.Bytes()) //nolint:errcheck
		})
	}
}

// recorder buffers a handler's response.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = code, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}

// problem writes an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck
		"type": "about:blank", "title": title, "status": status, "detail": detail,
	})
}
