// Package liveness is the table of live Relay processes (relay_processes):
// every client, scheduler, outbox dispatcher and relay serve records its
// process there at Start, heartbeats it every quarter of its liveness
// timeout, and deletes it at Stop. An entry is live while its last heartbeat
// is within its own timeout; an expired one (a killed process) is deleted by
// whichever live process heartbeats next, a bounded number at a time.
//
// On the same entries stands the one protocol of things "declared in code,
// owned by a namespace, kept alive by live processes" (schedules, outbox
// subscriptions): see Declarations.
package liveness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Roles of the processes Relay records.
const (
	RoleWorker     = "worker"     // a core client with queues
	RoleClient     = "client"     // a core client without queues (enqueues, rescues, cleans)
	RoleScheduler  = "scheduler"  // a scheduler.Scheduler
	RoleDispatcher = "dispatcher" // an outbox.Dispatcher
	RoleServe      = "serve"      // relay serve
)

// Entry is what a process records about itself.
type Entry struct {
	Role string
	// Name is what the process calls itself (a client's ID); may be empty.
	Name string
	// Namespace and Declares: what a declaring role's process keeps alive.
	Namespace string
	Declares  []string
	// Queues maps each queue a worker serves to its slots.
	Queues map[string]int
	// Timeout is the liveness timeout: the entry expires this long after
	// its last heartbeat. It heartbeats every quarter of it. Default 1m.
	Timeout time.Duration
}

// Process is one process's entry. Its loop (Keep or KeepDeclared) and
// Unregister may run at the same time; nothing in it changes after New.
type Process struct {
	pool    *pgxpool.Pool
	id      string
	e       Entry
	host    string
	pid     int
	version string
	queues  []byte // e.Queues as JSON
}

// MinTimeout is the shortest liveness timeout: a shorter one would
// heartbeat in a near spin.
const MinTimeout = time.Second

// New returns the entry of a process on pool, with a fresh id, this host,
// pid and version; nothing is written yet. A Timeout below MinTimeout is
// refused.
func New(pool *pgxpool.Pool, e Entry) (*Process, error) {
	if e.Timeout <= 0 {
		e.Timeout = time.Minute
	}
	if e.Timeout < MinTimeout {
		return nil, fmt.Errorf("LivenessTimeout %s is below %s (the process heartbeats every quarter of it)", e.Timeout, MinTimeout)
	}
	if e.Declares == nil {
		e.Declares = []string{}
	}
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("process id: %w", err)
	}
	q := e.Queues
	if q == nil {
		q = map[string]int{}
	}
	queues, err := json.Marshal(q)
	if err != nil {
		return nil, fmt.Errorf("encode queues: %w", err)
	}
	host, _ := os.Hostname()
	return &Process{pool: pool, id: hex.EncodeToString(id[:]), e: e, host: host, pid: os.Getpid(),
		version: Version(), queues: queues}, nil
}

// ID is the entry's id in relay_processes.
func (p *Process) ID() string { return p.id }

// Interval is how often the process heartbeats: a quarter of its timeout.
func (p *Process) Interval() time.Duration { return p.e.Timeout / 4 }

// DB runs statements: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Register records (or refreshes) the entry in q.
func (p *Process) Register(ctx context.Context, q DB) error {
	_, err := q.Exec(ctx, sqlRegister, p.id, p.e.Role, p.e.Name, p.e.Namespace, p.e.Declares,
		p.host, p.pid, p.version, string(p.queues), p.e.Timeout.Seconds())
	if err != nil {
		return fmt.Errorf("register process: %w", err)
	}
	return nil
}

// sweepLimit bounds the expired entries one heartbeat deletes.
const sweepLimit = 100

// heartbeat renews the entry in q and sweeps expired ones; false: the
// entry had expired (or was deleted) and must be registered again.
func (p *Process) heartbeat(ctx context.Context, q DB) (bool, error) {
	var beat, swept int64
	if err := q.QueryRow(ctx, sqlHeartbeat, p.id, sweepLimit).Scan(&beat, &swept); err != nil {
		return false, fmt.Errorf("heartbeat: %w", err)
	}
	return beat == 1, nil
}

// Keep heartbeats the entry every Interval until ctx ends, registering it
// again when it expired meanwhile (the process paused, or the database was
// unreachable, past its timeout). A failure is logged and tried again at
// the next interval. Register the entry before calling it.
func (p *Process) Keep(ctx context.Context, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.Interval()):
		}
		alive, err := p.heartbeat(ctx, p.pool)
		if err == nil && !alive {
			log.Warn("relay: process entry had expired; recording it again", "role", p.e.Role, "process_id", p.id)
			err = p.Register(ctx, p.pool)
		}
		if err != nil && ctx.Err() == nil {
			log.Error("relay: process heartbeat failed", "role", p.e.Role, "process_id", p.id, "err", err)
		}
	}
}

// unregisterTimeout bounds Unregister after its context has ended.
const unregisterTimeout = 5 * time.Second

// Unregister deletes the entry: bounded by ctx while it lasts, and by a
// few seconds in any case, also once ctx ended (a Stop that used it up),
// so that an unresponsive database cannot hold a Stop for ever.
func (p *Process) Unregister(ctx context.Context) error {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, unregisterTimeout)
	defer cancel()
	if _, err := p.pool.Exec(ctx, sqlUnregister, p.id); err != nil {
		return fmt.Errorf("unregister process: %w", err)
	}
	return nil
}

// Version names the running build: the main module's path and version
// (its VCS revision when built from a checkout), and Relay's version when
// Relay is a dependency.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	v := bi.Main.Path + " " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += "+dirty"
		}
	}
	if bi.Main.Path != modulePath {
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				v += ", relay " + d.Version
			}
		}
	}
	return v
}

const modulePath = "github.com/relayq/relay"

// Info is a live entry, as List reads it.
type Info struct {
	ID, Role, Name, Namespace string
	Declares                  []string
	Host                      string
	PID                       int
	Version                   string
	Queues                    map[string]int
	StartedAt, LastSeenAt     time.Time
	Timeout                   time.Duration
	ExpiresAt                 time.Time
}

// List returns the live entries, by role, host and start. An entry whose
// stored queues do not decode lists without them.
func List(ctx context.Context, q DB) ([]Info, error) {
	rows, err := q.Query(ctx, sqlList)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Info, error) {
		var i Info
		var queues []byte
		var secs float64
		err := r.Scan(&i.ID, &i.Role, &i.Name, &i.Namespace, &i.Declares, &i.Host, &i.PID, &i.Version,
			&queues, &i.StartedAt, &i.LastSeenAt, &secs, &i.ExpiresAt)
		i.Timeout = time.Duration(secs * float64(time.Second))
		if err == nil && json.Unmarshal(queues, &i.Queues) != nil {
			i.Queues = nil
		}
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	return out, nil
}

// errExpired: a heartbeat found the entry expired or gone.
var errExpired = errors.New("process entry expired")
