package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/appname"
	"github.com/relayq/relay/internal/background"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/liveness"
)

// Config configures a Scheduler. Only Schedules is needed; the zero value of
// every other field is a sensible default.
type Config struct {
	// Schedules are this process's declarations. Start upserts them; a
	// stored schedule of Namespace is retired (disabled) only when no live
	// process of Namespace declares it, so processes of different versions
	// (a rolling deploy) and different services can share a database.
	Schedules []Schedule
	// Namespace owns the schedules: one per service sharing the database.
	// Only processes of a namespace retire its schedules; a name declared by
	// a live process of another namespace is an error. Default "default".
	Namespace string
	// LivenessTimeout is how long a process's declarations keep its
	// schedules alive after its last heartbeat (it heartbeats four times per
	// timeout while running; Stop ends its declarations at once). It is
	// stored with the process: every process judges this one by it, so
	// processes may use different timeouts. At least 1s; default 1m.
	LivenessTimeout time.Duration
	// PollInterval is the longest the scheduler sleeps between due checks
	// (it wakes sooner when a fire is due sooner). Default 1s.
	PollInterval time.Duration
	// MisfireGrace is how late a fire may be reached and still count as on
	// time rather than missed (see CatchUp). Default 30s.
	MisfireGrace time.Duration
	// FireRetention is how long the record of each fire is kept. Default
	// 7 days.
	FireRetention time.Duration
	// BatchSize caps the schedules fired in one transaction. Default 50.
	BatchSize int
	// Logger receives the scheduler's logs. Default slog.Default().
	Logger *slog.Logger
}

// Scheduler fires declared schedules: at each schedule's fire time, exactly
// one process enqueues its job. Run one in as many processes as you like.
type Scheduler struct {
	pool  *pgxpool.Pool
	cfg   Config
	proc  *liveness.Process // this process's entry, declaring the schedules
	decls []*declared
	specs specCache

	brokenMu sync.Mutex
	broken   map[string]time.Time // schedules this process cannot evaluate → when to try again

	registered atomic.Bool // Declare stored this process; Stop removes it

	runner background.Runner // Start and Stop
}

// New validates the schedules (a broken spec is an error naming the schedule
// and the field) and returns a Scheduler that has not started.
func New(pool *pgxpool.Pool, cfg *Config) (*Scheduler, error) {
	if pool == nil {
		return nil, errors.New("scheduler: nil pool")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.MisfireGrace <= 0 {
		c.MisfireGrace = 30 * time.Second
	}
	if c.FireRetention <= 0 {
		c.FireRetention = 7 * 24 * time.Hour
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 50
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.LivenessTimeout <= 0 {
		c.LivenessTimeout = time.Minute
	}
	s := &Scheduler{pool: pool, cfg: c, broken: map[string]time.Time{}}
	var errs []error
	seen := map[string]bool{}
	for _, sc := range c.Schedules {
		d, err := sc.validate()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[d.name] {
			errs = append(errs, fmt.Errorf("scheduler: schedule %q declared twice", d.name))
		}
		seen[d.name] = true
		s.decls = append(s.decls, d)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(s.decls))
	for _, d := range s.decls {
		names = append(names, d.name)
	}
	proc, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleScheduler, Namespace: c.Namespace,
		Declares: names, Timeout: c.LivenessTimeout})
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	s.proc = proc
	return s, nil
}

// Start declares the schedules in the database, then fires them in the
// background until Stop. It returns once the declarations are stored.
func (s *Scheduler) Start(ctx context.Context) error {
	if err := s.Declare(ctx); err != nil {
		return err
	}
	return s.runner.Start(ctx, "scheduler", s.run, s.heartbeat)
}

// Stop stops firing. A tick under way finishes (or, when ctx ends first, is
// abandoned and its transaction rolled back: a fire is never half done).
func (s *Scheduler) Stop(ctx context.Context) error {
	err := s.runner.Stop(ctx, "scheduler")
	// This process no longer declares anything; the live ones retire what
	// only it declared at their next heartbeat. Bounded even once ctx has
	// ended (Unregister).
	if s.registered.Load() {
		if uerr := s.proc.Unregister(ctx); uerr != nil {
			err = errors.Join(err, fmt.Errorf("scheduler: %w", uerr))
		}
	}
	return err
}

// Declare stores the schedules without firing them: it upserts every
// declared schedule, records this process as declaring them, and retires the
// schedules of the namespace that no live process declares, in one
// transaction. Start calls it. Called alone (from a deploy step), its
// declarations count for one LivenessTimeout.
func (s *Scheduler) Declare(ctx context.Context) error {
	s.registered.Store(true) // set first: Stop may remove a row this commits
	if err := s.proc.Declare(ctx, s.declarations()); err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

// declarations is the scheduler's part of the declaration protocol
// (internal/liveness): its upsert of the schedules and its retirement.
func (s *Scheduler) declarations() liveness.Declarations {
	return liveness.Declarations{Upsert: s.upsert, Retire: s.retire}
}

// upsert stores every declared schedule in tx; a name a live process of
// another namespace declares is ErrOwned.
func (s *Scheduler) upsert(ctx context.Context, tx pgx.Tx) error {
	var now time.Time
	if err := tx.QueryRow(ctx, sqlNow).Scan(&now); err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	for _, d := range s.decls {
		next := d.parsed.Next(now)
		rows, err := tx.Query(ctx, sqlDeclare, d.name, d.spec, d.timezone, d.kind, string(d.args), d.queue,
			d.priority, d.maxAttempts, string(d.metadata), d.catchUp, d.catchUpLimit, d.overlap, next,
			s.cfg.Namespace)
		if err != nil {
			return fmt.Errorf("declare schedule %q: %w", d.name, err)
		}
		stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("declare schedule %q: %w", d.name, err)
		}
		if len(stored) == 0 {
			var owner string
			if err := tx.QueryRow(ctx, sqlOwner, d.name).Scan(&owner); err != nil {
				return fmt.Errorf("declare schedule %q: read its owner: %w", d.name, err)
			}
			return fmt.Errorf("declare schedule %q in namespace %q: %w %q, whose live processes declare it",
				d.name, s.cfg.Namespace, ErrOwned, owner)
		}
	}
	return nil
}

// retire disables the schedules of the namespace that no live process
// declares. The caller holds the namespace lock.
func (s *Scheduler) retire(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, sqlRetire, s.cfg.Namespace)
	if err != nil {
		return fmt.Errorf("retire undeclared schedules: %w", err)
	}
	disabled, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("retire undeclared schedules: %w", err)
	}
	if len(disabled) > 0 {
		s.cfg.Logger.Info("relay: disabled schedules no live process declares",
			"namespace", s.cfg.Namespace, "schedules", disabled)
	}
	return nil
}

// heartbeat keeps this process's declarations alive and retires what no
// live process of the namespace declares any more. A process found expired
// (it paused longer than the timeout) declares again.
func (s *Scheduler) heartbeat(ctx context.Context) {
	s.proc.KeepDeclared(ctx, s.declarations(), s.cfg.Logger, "scheduler")
}

// brokenRecheck is how long a process leaves a schedule it could not
// evaluate before trying (and logging) again.
const brokenRecheck = 5 * time.Minute

// skipped lists the schedules this process cannot evaluate now, forgetting
// the ones whose recheck time has come.
func (s *Scheduler) skipped() []string {
	s.brokenMu.Lock()
	defer s.brokenMu.Unlock()
	out := make([]string, 0, len(s.broken))
	for name, until := range s.broken {
		if time.Now().After(until) {
			delete(s.broken, name)
			continue
		}
		out = append(out, name)
	}
	return out
}

func (s *Scheduler) run(ctx context.Context) {
	lastCleanup := time.Time{}
	for {
		full, err := s.tick(ctx)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Error("relay: scheduler tick failed", "err", err)
		}
		if time.Since(lastCleanup) > time.Hour {
			lastCleanup = time.Now()
			s.cleanup(ctx)
		}
		wait := time.Duration(0)
		switch {
		case err != nil:
			// Not a schedule's fault (those are isolated in tick): the
			// database. Wait a poll interval rather than retry at once.
			wait = s.cfg.PollInterval
		case !full:
			wait = s.untilDue(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// untilDue is how long to sleep: until the soonest fire, at most
// PollInterval.
func (s *Scheduler) untilDue(ctx context.Context) time.Duration {
	var secs float64
	if err := s.pool.QueryRow(ctx, sqlNextDue, s.skipped()).Scan(&secs); err != nil {
		return s.cfg.PollInterval
	}
	d := time.Duration(secs * float64(time.Second))
	return min(max(d, 0), s.cfg.PollInterval)
}

// tick fires the due schedules this process can lock, in one transaction:
// the fires' records, their jobs and the schedules' advance commit together
// or not at all. It reports whether the batch was full (more may be due).
func (s *Scheduler) tick(ctx context.Context) (full bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlLockDue, s.cfg.BatchSize, s.skipped())
		if err != nil {
			return fmt.Errorf("lock due schedules: %w", err)
		}
		due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*row, error) { return scanRow(r) })
		if err != nil {
			return fmt.Errorf("lock due schedules: %w", err)
		}
		full = len(due) == s.cfg.BatchSize
		if len(due) > 0 {
			// Named for the rest of the transaction only: an operator finds
			// a firing tick in pg_stat_activity as relay-scheduler.
			name := appname.For(s.pool.Config().ConnConfig.RuntimeParams["application_name"], "scheduler", "")
			if _, err := tx.Exec(ctx, sqlNameSession, name); err != nil {
				return fmt.Errorf("name the session: %w", err)
			}
		}
		for _, r := range due {
			if err := s.fireIsolated(ctx, tx, r); err != nil {
				return fmt.Errorf("schedule %q: %w", r.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("scheduler: %w", err)
	}
	return full, nil
}

// fireIsolated fires one schedule under a savepoint. A schedule whose fire
// fails (a stored row this process cannot enqueue from: bad metadata, a
// queue or priority the core refuses) is rolled back alone, marked with its
// error and left to other processes until failRecheck, so that it neither
// takes the other schedules' fires down with it nor makes the loop spin.
// Only an error that leaves the transaction unusable is returned.
func (s *Scheduler) fireIsolated(ctx context.Context, tx pgx.Tx, r *row) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	ferr := s.fire(ctx, sp, r)
	if ferr == nil {
		return sp.Commit(ctx)
	}
	if err := sp.Rollback(ctx); err != nil {
		return errors.Join(ferr, fmt.Errorf("roll back to savepoint: %w", err))
	}
	if ctx.Err() != nil || transient(ferr) {
		// The tick fails and the next one fires it: a lock or statement
		// timeout (a managed server's, set on the role), a serialization
		// failure or a deadlock says nothing about the schedule.
		return ferr
	}
	s.skip(r.name, failRecheck)
	s.cfg.Logger.Error("relay: schedule could not fire; leaving it to other processes for a while",
		"schedule", r.name, "err", ferr, "recheck_in", failRecheck)
	if _, err := tx.Exec(ctx, sqlMarkBroken, r.name, ferr.Error()); err != nil {
		return fmt.Errorf("mark broken: %w", err)
	}
	return nil
}

// transient says whether err is the server giving up on a statement for
// reasons outside the schedule: lock_timeout (55P03), statement_timeout or
// a cancel (57014), a serialization failure (40001) or a deadlock (40P01).
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55P03", "57014", "40001", "40P01":
		return true
	}
	return false
}

// failRecheck is how long a process leaves a schedule whose fire failed
// before trying (and logging) again.
const failRecheck = time.Minute

// skip leaves a schedule alone for d.
func (s *Scheduler) skip(name string, d time.Duration) {
	s.brokenMu.Lock()
	s.broken[name] = time.Now().Add(d)
	s.brokenMu.Unlock()
}

// fire handles one locked, due schedule: enqueues the fires its catch-up
// policy keeps and advances it.
func (s *Scheduler) fire(ctx context.Context, tx pgx.Tx, r *row) error {
	if !r.nextFinite {
		return errors.New("stored next_fire_at is not a finite time (pause and resume the schedule to restart it from its next fire)")
	}
	spec, err := s.specs.get(r.spec, r.timezone)
	if err != nil {
		// Stored by a newer or broken declaration: leave it to a process
		// that understands it, say so once per recheck, and mark the row so
		// List shows why it does not fire.
		s.skip(r.name, brokenRecheck)
		s.cfg.Logger.Error("relay: schedule has a spec this process cannot evaluate; leaving it to processes that can",
			"schedule", r.name, "err", err, "recheck_in", brokenRecheck)
		if _, err := tx.Exec(ctx, sqlMarkBroken, r.name, err.Error()); err != nil {
			return fmt.Errorf("mark broken: %w", err)
		}
		return nil
	}
	keep := 0
	switch r.catchUp {
	case "latest":
		keep = 1
	case "all":
		keep = r.catchUpLimit
	}
	p := planFires(spec, r.nextFireAt, r.now, s.cfg.MisfireGrace, keep)
	if p.missed > 0 {
		s.cfg.Logger.Warn("relay: schedule missed fires; catch-up policy applied",
			"schedule", r.name, "catch_up", r.catchUp, "dropped", p.missed, "enqueuing", len(p.fires))
	}
	var lastFire *time.Time
	lastJob := r.lastJobID
	for _, ft := range p.fires {
		outcome := "enqueued"
		if r.overlap == "skip" && lastJob != nil {
			busy, err := stillRunning(ctx, tx, *lastJob)
			if err != nil {
				return err
			}
			if busy {
				outcome = "skipped_overlap"
			}
		}
		recorded, err := recordFire(ctx, dbx.PGX{Q: tx}, r.name, ft, outcome)
		if err != nil {
			return err
		}
		if !recorded {
			continue // handled before (the primary key says so)
		}
		ft := ft
		lastFire = &ft
		if outcome != "enqueued" {
			s.cfg.Logger.Info("relay: schedule fire skipped; previous job still running", "schedule", r.name, "fire_time", ft, "job_id", *lastJob)
			continue
		}
		id, err := enqueueFire(ctx, dbx.PGX{Q: tx}, tx, r, ft)
		if err != nil {
			return err
		}
		lastJob = &id
	}
	if _, err := tx.Exec(ctx, sqlAdvance, r.name, p.next, lastFire, lastJob); err != nil {
		return fmt.Errorf("advance: %w", err)
	}
	return nil
}

func recordFire(ctx context.Context, tx dbx.Execer, name string, ft time.Time, outcome string) (bool, error) {
	n := 0
	err := tx.Query(ctx, sqlRecordFire, []any{name, ft, outcome}, func(dbx.Scanner) error { n++; return nil })
	if err != nil {
		return false, fmt.Errorf("record fire %s: %w", ft, err)
	}
	return n == 1, nil
}

// enqueueFire enqueues a fire's job in transaction tx (ex its Execer) and
// links the fire record to it.
func enqueueFire(ctx context.Context, ex dbx.Execer, tx core.DB, r *row, ft time.Time) (int64, error) {
	// Values stay raw JSON: decoding them into any would turn large numbers
	// into float64 and change them on the way to the job.
	stored := map[string]json.RawMessage{}
	if err := json.Unmarshal(r.metadata, &stored); err != nil {
		return 0, fmt.Errorf("decode stored metadata: %w", err)
	}
	meta := make(map[string]any, len(stored)+2)
	for k, v := range stored { // a stored JSON null leaves stored nil: no keys
		meta[k] = v
	}
	meta[MetaSchedule] = r.name
	meta[MetaFireTime] = ft.UTC().Format(time.RFC3339Nano)
	res, err := core.Enqueue(ctx, tx, storedArgs{kind: r.kind, args: r.args}, &core.EnqueueOpts{
		Queue: r.queue, Priority: new(r.priority), MaxAttempts: r.maxAttempts, Metadata: meta,
	})
	if err != nil {
		return 0, fmt.Errorf("enqueue fire %s: %w", ft, err)
	}
	if _, err := ex.Exec(ctx, sqlSetFireJob, r.name, ft, res.ID); err != nil {
		return 0, fmt.Errorf("record fire %s: %w", ft, err)
	}
	return res.ID, nil
}

// stillRunning reports whether a schedule's previous job is queued or
// running. A job deleted by retention is not.
func stillRunning(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	j, err := core.JobGet(ctx, tx, id)
	if errors.Is(err, core.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !j.State.Final(), nil
}

func (s *Scheduler) cleanup(ctx context.Context) {
	for {
		tag, err := s.pool.Exec(ctx, sqlDeleteFires, s.cfg.FireRetention.Seconds(), 1000)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.Error("relay: delete old schedule fires", "err", err)
			}
			return
		}
		if tag.RowsAffected() < 1000 {
			return
		}
	}
}

// row is a locked schedule row.
type row struct {
	name, spec, timezone, kind string
	args, metadata             json.RawMessage
	queue                      string
	priority, maxAttempts      int
	catchUp                    string
	catchUpLimit               int
	overlap                    string
	nextFireAt                 time.Time
	nextFinite                 bool // false: next_fire_at is an infinity, nextFireAt zero
	lastJobID                  *int64
	now                        time.Time
}

func scanRow(r dbx.Scanner) (*row, error) {
	var x row
	var args, meta string
	// A next fire of -infinity (written behind Declare) is due for ever and
	// no Go time holds it: it fails its own schedule's fire (see fire),
	// not the scan of every due schedule.
	var next pgtype.Timestamptz
	err := r.Scan(&x.name, &x.spec, &x.timezone, &x.kind, &args, &x.queue, &x.priority, &x.maxAttempts, &meta,
		&x.catchUp, &x.catchUpLimit, &x.overlap, &next, &x.lastJobID, &x.now)
	x.args, x.metadata = json.RawMessage(args), json.RawMessage(meta)
	x.nextFireAt, x.nextFinite = next.Time, next.InfinityModifier == pgtype.Finite
	return &x, err
}

// finite is a stored time List can report: nil for NULL and for the
// infinities no Go time holds.
func finite(t pgtype.Timestamptz) *time.Time {
	if !t.Valid || t.InfinityModifier != pgtype.Finite {
		return nil
	}
	return &t.Time
}

// specCache keeps parsed specs by text and zone.
type specCache struct {
	mu sync.Mutex
	m  map[string]*Spec
}

func (c *specCache) get(spec, tz string) (*Spec, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := tz + "\x00" + spec
	if s, ok := c.m[key]; ok {
		return s, nil
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("time zone %q: %w", tz, err)
	}
	s, err := ParseSpec(spec, loc)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*Spec{}
	}
	c.m[key] = s
	return s, nil
}
