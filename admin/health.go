package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
)

// Healthz answers 200 while the process serves: a liveness check.
func Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}` + "\n")) //nolint:errcheck // the client has gone if this fails
	})
}

// Readyz answers 200 when the database answers within two seconds and every
// migration this build embeds is applied, else 503 with a problem body
// saying which: a readiness check.
func Readyz(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			writeProblem(w, r, http.StatusServiceUnavailable, "database unreachable: "+err.Error())
			return
		}
		pending, err := migrations.Pending(ctx, pool)
		if err != nil {
			writeProblem(w, r, http.StatusServiceUnavailable, err.Error())
			return
		}
		if len(pending) > 0 {
			writeProblem(w, r, http.StatusServiceUnavailable,
				fmt.Sprintf("%d migration(s) not applied (run relay migrate): %s", len(pending), strings.Join(pending, ", ")))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"status": "ready"}) //nolint:errcheck // the client has gone if this fails
	})
}
