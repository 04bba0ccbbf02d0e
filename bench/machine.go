package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Machine describes where a run happens: CPU, PostgreSQL version and the
// settings that move the figures.
func Machine(ctx context.Context, pool *pgxpool.Pool) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	var version, settings string
	pool.QueryRow(ctx, `SELECT current_setting('server_version'),
		string_agg(name || '=' || setting || coalesce(unit, ''), ' ' ORDER BY name)
		FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'max_connections', 'wal_level', 'max_wal_size')`).
		Scan(&version, &settings) //nolint:errcheck
	return fmt.Sprintf("%d CPUs (%s), PostgreSQL %s (%s)", runtime.NumCPU(), cpu, version, settings)
}
