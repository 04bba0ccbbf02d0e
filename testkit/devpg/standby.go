package devpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions tune StartStandby. The zero value is an asynchronous
// streaming standby.
type StandbyOptions struct {
	// Synchronous makes the primary wait for this standby at every
	// synchronous commit (synchronous_standby_names names it), so a commit
	// the primary acknowledged is on the standby too. Without it the
	// standby streams asynchronously: the last commits the primary
	// acknowledged before a crash can be missing from it. A Fast primary
	// waits only if it was started with SynchronousCommit.
	Synchronous bool
	// Via is the host:port the standby copies and streams the primary
	// from: a proxy in front of the primary, which a test can cut to hold
	// the standby back. Default: the primary's own address.
	Via string
}

// StartStandby makes a streaming standby of primary (pg_basebackup -R into
// a fresh temporary directory, streaming under the application name its
// Name returns), starts it on a free port and waits until the primary
// sees it streaming, and with Synchronous until the primary counts it as
// its synchronous standby. The standby's URL reaches it as a read-only
// hot standby; Promote makes it a primary. Stop removes it.
func StartStandby(ctx context.Context, primary *Cluster, opts StandbyOptions) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "relay-pg-")
	if err != nil {
		return nil, fmt.Errorf("devpg: temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("devpg: %w", err)
	}
	s := &Cluster{Dir: dir, bin: primary.bin, cred: primary.cred, opts: primary.opts}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("devpg: chown %s: %w", dir, err)
		}
	}
	if s.Port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	name := s.Name()
	s.logf("devpg: pg_basebackup of 127.0.0.1:%d into %s (standby %s)", primary.Port, dir, name)
	// -R writes primary_conninfo (with this connection's application_name)
	// and standby.signal; -X stream copies the WAL written meanwhile.
	host, port := "127.0.0.1", strconv.Itoa(primary.Port)
	if opts.Via != "" {
		if host, port, err = net.SplitHostPort(opts.Via); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("devpg: standby's Via %q: %w", opts.Via, err)
		}
	}
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, name)
	if out, err := s.run(ctx, "pg_basebackup", "-D", s.dataDir(), "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("devpg: pg_basebackup: %w\n%s", err, out)
	}
	if err := s.Start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if opts.Synchronous {
		// Set on the primary only, after the base backup: a standby
		// promoted with this setting copied would wait for a standby of its
		// own that does not exist, and no commit would return.
		if err := primary.exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '"%s"'`, name), `SELECT pg_reload_conf()`); err != nil {
			s.Stop() //nolint:errcheck
			return nil, err
		}
	}
	want := "async"
	if opts.Synchronous {
		want = "sync"
	}
	if err := waitFor(ctx, primary.URL, 60*time.Second,
		`SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2)`,
		name, want); err != nil {
		s.Stop() //nolint:errcheck
		return nil, fmt.Errorf("devpg: standby %s not streaming (%s) from 127.0.0.1:%d: %w", name, want, primary.Port, err)
	}
	return s, nil
}

// Name is the application name a standby made by StartStandby streams
// under (what pg_stat_replication and synchronous_standby_names call it).
func (c *Cluster) Name() string { return fmt.Sprintf("relay_standby_%d", c.Port) }

// Kill stops the server the way a crash would (immediate shutdown) and
// leaves it stopped, its directory kept: a primary lost in a failover.
func (c *Cluster) Kill(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("devpg: pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	return nil
}

// Promote makes a standby a primary (pg_ctl promote) and waits until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("devpg: pg_ctl promote: %w\n%s", err, out)
	}
	if err := waitFor(ctx, c.URL, 60*time.Second, `SELECT NOT pg_is_in_recovery()`); err != nil {
		return fmt.Errorf("devpg: promoted standby 127.0.0.1:%d does not accept writes: %w", c.Port, err)
	}
	return nil
}

// MultiHostURL is a URL naming every cluster's host, in order, with
// target_session_attrs=read-write: a connection goes to whichever of them
// is the primary now, as an application's does across a failover.
func MultiHostURL(clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", c.Port)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write"
}

// exec runs statements on the cluster, one connection.
func (c *Cluster) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("devpg: connect to 127.0.0.1:%d: %w", c.Port, err)
	}
	defer conn.Close(ctx)
	for _, stmt := range stmts {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("devpg: %s: %w", stmt, err)
		}
	}
	return nil
}

// waitFor polls query (one boolean) at url until it is true, for at most d.
func waitFor(ctx context.Context, url string, d time.Duration, query string, args ...any) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		var ok bool
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			err = conn.QueryRow(ctx, query, args...).Scan(&ok)
			conn.Close(ctx)
		}
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last == nil {
				last = errors.New("still false")
			}
			return fmt.Errorf("after %s: %w", d, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
