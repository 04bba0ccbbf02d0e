package core_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
)

// columnsFor sets the columns that must agree with each state (the CHECK
// constraints), so that only the transition trigger decides.
var columnsFor = map[core.JobState]string{
	core.StateQueued:    `lease_token = NULL, lease_expires_at = NULL, finalized_at = NULL`,
	core.StateClaimed:   `lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute', finalized_at = NULL`,
	core.StateSucceeded: `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
	core.StateDead:      `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
	core.StateCancelled: `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
}

// pathTo reaches each state from queued by legal steps only.
var pathTo = map[core.JobState][]core.JobState{
	core.StateQueued:    nil,
	core.StateClaimed:   {core.StateClaimed},
	core.StateSucceeded: {core.StateClaimed, core.StateSucceeded},
	core.StateDead:      {core.StateClaimed, core.StateDead},
	core.StateCancelled: {core.StateCancelled},
}

// TestStateMachine walks every pair of states through raw SQL: the database
// allows exactly the transitions of core.CanTransition, and those are exactly
// the rows of docs/state-machine.md.
func TestStateMachine(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	set := func(id int64, to core.JobState) error {
		_, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = $2, `+columnsFor[to]+` WHERE id = $1`, id, string(to))
		return err
	}
	for _, from := range core.States() {
		for _, to := range core.States() {
			if from == to {
				continue
			}
			var id int64
			if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('walk') RETURNING id`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			for _, step := range pathTo[from] {
				if err := set(id, step); err != nil {
					t.Fatalf("reaching %s: step to %s refused: %v", from, step, err)
				}
			}
			err := set(id, to)
			legal := core.CanTransition(from, to)
			var pgErr *pgconn.PgError
			switch {
			case legal && err != nil:
				t.Errorf("%s → %s is legal but refused: %v", from, to, err)
			case !legal && err == nil:
				t.Errorf("%s → %s is illegal but allowed", from, to)
			case !legal && (!errors.As(err, &pgErr) || pgErr.Code != "RLY01"):
				t.Errorf("%s → %s refused with %v, want SQLSTATE RLY01", from, to, err)
			}
		}
	}

	// Jobs are inserted queued only; unknown states fail the CHECK.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state, finalized_at) VALUES ('walk', 'succeeded', now())`); err == nil {
		t.Error("insert as succeeded allowed")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state) VALUES ('walk', 'running')`); err == nil {
		t.Error("unknown state allowed")
	}

	// The documented table lists exactly the legal transitions.
	doc, err := os.ReadFile("../docs/state-machine.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[[2]core.JobState]bool{}
	row := regexp.MustCompile(`(?m)^\| (\w+) \| (\w+) \|`)
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if m[1] == "from" {
			continue
		}
		documented[[2]core.JobState{core.JobState(m[1]), core.JobState(m[2])}] = true
	}
	for _, from := range core.States() {
		for _, to := range core.States() {
			if core.CanTransition(from, to) != documented[[2]core.JobState{from, to}] {
				t.Errorf("docs/state-machine.md and core disagree on %s → %s", from, to)
			}
		}
	}
}
