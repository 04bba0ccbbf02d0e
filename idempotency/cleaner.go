package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/background"
)

// CleanerConfig configures a Cleaner. The zero value (or nil) is usable.
type CleanerConfig struct {
	// Interval between sweeps. Default 1 minute.
	Interval time.Duration
	// BatchSize bounds each DELETE; a sweep repeats batches until one comes
	// back short. Default 1000.
	BatchSize int
	// Logger receives failures. Default slog.Default().
	Logger *slog.Logger
}

// Cleaner deletes expired keys on a timer, in bounded batches, each in a
// transaction of its own. Run one where Once is used: Once deletes nothing
// in its caller's transaction. External and Middleware already delete
// expired keys as new keys arrive; a Cleaner also reclaims them when
// traffic stops, and keeps that work off the request path.
type Cleaner struct {
	pool   *pgxpool.Pool
	cfg    CleanerConfig
	runner background.Runner
}

// NewCleaner returns a Cleaner that has not started.
func NewCleaner(pool *pgxpool.Pool, cfg *CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, errors.New("idempotency: nil pool")
	}
	c := CleanerConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Cleaner{pool: pool, cfg: c}, nil
}

// Start sweeps at once, then every Interval, until Stop.
func (c *Cleaner) Start(ctx context.Context) error {
	return c.runner.Start(ctx, "idempotency cleaner", c.run)
}

// Stop ends the sweeps; one under way finishes its statement or is
// cancelled.
func (c *Cleaner) Stop(ctx context.Context) error {
	return c.runner.Stop(ctx, "idempotency cleaner")
}

func (c *Cleaner) run(ctx context.Context) {
	for {
		for {
			n, err := DeleteExpired(ctx, c.pool, c.cfg.BatchSize)
			if err != nil {
				if ctx.Err() == nil {
					c.cfg.Logger.Error("relay: idempotency cleaner", "err", err)
				}
				break // try again next interval
			}
			if n < int64(c.cfg.BatchSize) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.cfg.Interval):
		}
	}
}
