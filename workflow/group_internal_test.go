package workflow

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/fence"
	"github.com/relayq/relay/testkit/testdb"
)

// insertMember writes n (and its transaction's id) into group_t, then runs
// last, whose error is the member's.
func insertMember(n int, last string, args ...any) member {
	return member{
		job: int64(100 - n), // sorted against the order given
		queue: func(b *pgx.Batch) {
			b.Queue(`INSERT INTO group_t VALUES ($1, txid_current())`, n)
			b.Queue(last, args...)
		},
		read: func(br pgx.BatchResults) error {
			_, err := br.Exec()
			var one int
			if e := br.QueryRow().Scan(&one); err == nil {
				err = e
			}
			return err
		},
	}
}

// groupDB returns a test database with table group_t (n, xid) and, when
// gate, table gate (one row) locked by a transaction the caller rolls back.
func groupDB(t *testing.T, gate bool) (*pgxpool.Pool, pgx.Tx) {
	t.Helper()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE group_t (n int, xid bigint); CREATE TABLE gate (id int); INSERT INTO gate VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if !gate {
		return pool, nil
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Rollback(context.Background()) }) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT * FROM gate FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return pool, holder
}

// A member whose statement the server refuses rolls its group back: a
// lost lease is that member's verdict, any other refusal is tried again
// alone (where it fails again here), and the other members go again
// together: they commit, each once, in one transaction.
func TestGroupRefusesOnlyTheFailingMembers(t *testing.T) {
	t.Parallel()
	pool, _ := groupDB(t, false)
	ctx := context.Background()
	var calls []*groupCall
	for n := range 6 {
		last := `SELECT 1`
		switch n {
		case 1:
			last = `SELECT 1 FROM (SELECT relay_hold_lease(0, gen_random_uuid())) AS held` // RLY02
		case 3:
			last = `SELECT 1 / (n - 3) FROM group_t WHERE n = 3` // division by zero
		}
		calls = append(calls, &groupCall{ctx: ctx, m: insertMember(n, last), done: make(chan error, 1)})
	}
	sendGroup(pool, calls)
	for _, c := range calls {
		err := <-c.done
		n := 100 - int(c.m.job)
		var pgErr *pgconn.PgError
		switch {
		case n == 1 && !fence.IsLost(err):
			t.Errorf("member 1: %v, want a lost lease", err)
		case n == 3 && !(errors.As(err, &pgErr) && pgErr.Code == "22012"):
			t.Errorf("member 3: %v, want division by zero", err)
		case n != 1 && n != 3 && err != nil:
			t.Errorf("member %d: %v", n, err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT n, count(*) FROM group_t GROUP BY n ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int, error) {
		var v [2]int
		return v, r.Scan(&v[0], &v[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := [][2]int{{0, 1}, {2, 1}, {4, 1}, {5, 1}}; !slices.Equal(got, want) {
		t.Fatalf("rows (n, count) %v, want %v", got, want)
	}
	if xids := testdb.Count(t, pool, `SELECT count(DISTINCT xid) FROM group_t`); xids != 1 {
		t.Fatalf("the members that committed did so in %d transactions, want 1 (one group)", xids)
	}
}

// A member waiting for a row lock (a caller's transaction holding its
// run's job row, as Signal does) does not hold up the rest of its group:
// they commit while the lock is held, and the waiting member once it is
// released.
func TestGroupDoesNotWaitForOneMembersLock(t *testing.T) {
	t.Parallel()
	pool, holder := groupDB(t, true)
	ctx := context.Background()
	var calls []*groupCall
	for n := range 3 {
		last := `SELECT 1`
		if n == 1 {
			last = `SELECT id FROM gate FOR UPDATE`
		}
		calls = append(calls, &groupCall{ctx: ctx, m: insertMember(n, last), done: make(chan error, 1)})
	}
	waiting := calls[1]
	returned := make(chan struct{})
	go func() {
		sendGroup(pool, slices.Clone(calls))
		close(returned)
	}()
	for _, c := range []*groupCall{calls[0], calls[2]} {
		select {
		case err := <-c.done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a member waited for another member's lock")
		}
	}
	select {
	case err := <-waiting.done:
		t.Fatalf("the member waiting for the lock was answered (%v) while the lock was held", err)
	default:
	}
	// The group is over (and its own context with it) before the lock
	// is released: the waiting member's send alone is bounded by its
	// caller's context only.
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("the group did not return while one member waited alone")
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting member was not answered after the lock was released")
	}
	if rows := testdb.Count(t, pool, `SELECT count(*) FROM group_t`); rows != 3 {
		t.Fatalf("%d rows, want 3", rows)
	}
}

// A member's own error that is not the server's (a row it did not find)
// is that member's alone: the group commits, the others' writes with it,
// and nothing is written twice.
func TestGroupMemberErrorStaysItsOwn(t *testing.T) {
	t.Parallel()
	pool, _ := groupDB(t, false)
	ctx := context.Background()
	var calls []*groupCall
	for n := range 3 {
		last := `SELECT 1`
		if n == 1 {
			last = `SELECT 1 WHERE false`
		}
		calls = append(calls, &groupCall{ctx: ctx, m: insertMember(n, last), done: make(chan error, 1)})
	}
	sendGroup(pool, calls)
	for _, c := range calls {
		err := <-c.done
		if n := 100 - int(c.m.job); (n == 1) != errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("member %d: %v", n, err)
		}
	}
	var rows, xids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xid) FROM group_t`).Scan(&rows, &xids); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || xids != 1 {
		t.Fatalf("%d rows in %d transactions, want 3 in 1 (one group)", rows, xids)
	}
}

// Writes that arrive while every sender is busy wait, and go together in
// the next group: one transaction for all of them.
func TestGroupWritesArrivingMeanwhileShareACommit(t *testing.T) {
	t.Parallel()
	pool, holder := groupDB(t, true) // the first groupSenders writes wait on the gate
	ctx := context.Background()
	g := &grouper{}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for n := range groupSenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- g.do(ctx, pool, insertMember(n, `SELECT id FROM gate FOR UPDATE`))
		}()
	}
	testdb.WaitFor(t, "every sender busy", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.senders == groupSenders
	})
	const later = 20
	for n := groupSenders; n < groupSenders+later; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- g.do(ctx, pool, insertMember(n, `SELECT 1`))
		}()
	}
	testdb.WaitFor(t, "the later writes pending", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.pending) == later
	})
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows, xids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xid) FROM group_t WHERE n >= $1`, groupSenders).Scan(&rows, &xids); err != nil {
		t.Fatal(err)
	}
	if rows != later || xids != 1 {
		t.Fatalf("the %d later writes: %d rows in %d transactions, want %d in 1", later, rows, xids, later)
	}
	// The last sender frees its place after it answered its group.
	testdb.WaitFor(t, "no sender and nothing pending", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.senders == 0 && len(g.pending) == 0
	})
}
