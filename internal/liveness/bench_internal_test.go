package liveness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// BenchmarkHeartbeat is one heartbeat statement (renewal and sweep) of a
// process among n live entries: what each process pays once per quarter of
// its liveness timeout (figures: docs/benchmarks.md).
func BenchmarkHeartbeat(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			pool := testdb.New(b)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `INSERT INTO relay_processes (id, role, queues, liveness_secs)
				SELECT 'w-' || i, 'worker', '{"default": 10}', 3600 FROM generate_series(1, $1) AS i`, n); err != nil {
				b.Fatal(err)
			}
			p, err := New(pool, Entry{Role: RoleWorker, Queues: map[string]int{"default": 10}, Timeout: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Register(ctx, pool); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if alive, err := p.heartbeat(ctx, pool); err != nil || !alive {
					b.Fatalf("heartbeat: %v, alive %v", err, alive)
				}
			}
		})
	}
}
