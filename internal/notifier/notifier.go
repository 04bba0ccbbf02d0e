// Package notifier holds one LISTEN connection for a client and hands every
// notification to a callback. It reconnects by itself after the connection
// drops, and reports each (re)connection so the caller can look for work it
// may have missed while deaf.
package notifier

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config describes what to listen to and where to report.
type Config struct {
	Pool *pgxpool.Pool // its connection settings are used; no pool slot is held
	// ConnConfig, when set, is used instead of Pool's settings: a direct
	// connection to the server when Pool goes through a transaction-pooling
	// proxy, where a LISTEN does not outlive its transaction.
	ConnConfig *pgx.ConnConfig
	Channels   []string
	// OnNotify is called for every notification, on the listener goroutine:
	// it must not block.
	OnNotify func(channel, payload string)
	// OnConnect is called after every successful LISTEN, the first included.
	OnConnect func()
	Logger    *slog.Logger
	// AppName is the connection's application_name (visible in
	// pg_stat_activity).
	AppName string
}

// Run listens until ctx is done. It returns only then.
func Run(ctx context.Context, cfg Config) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		connected, err := listen(ctx, cfg)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = 100 * time.Millisecond // a fresh outage starts the backoff over
		}
		cfg.Logger.Warn("relay: listener connection lost; reconnecting", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// listen connects, LISTENs and delivers notifications until an error. It
// reports whether it got as far as listening.
func listen(ctx context.Context, cfg Config) (bool, error) {
	var cc *pgx.ConnConfig
	if cfg.ConnConfig != nil {
		cc = cfg.ConnConfig.Copy()
	} else {
		cc = cfg.Pool.Config().ConnConfig.Copy()
	}
	if cfg.AppName != "" {
		cc.RuntimeParams["application_name"] = cfg.AppName
	}
	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(connectCtx, cc)
	cancel()
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range cfg.Channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return false, err
		}
	}
	if cfg.OnConnect != nil {
		cfg.OnConnect()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return true, nil
			}
			return true, err
		}
		cfg.OnNotify(n.Channel, n.Payload)
	}
}
