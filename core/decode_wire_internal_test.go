package core

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

// claimDecoder gives every claimed row the values Scan gives it: kinds,
// queues, keys, tags (none, several, a NULL among them), metadata, args,
// priorities and timestamps, including the rows written behind the API
// that the client cannot run (infinite timestamps, an attempt beyond
// max_attempts). It reads them from the wire, not through Scan.
func TestClaimDecoderMatchesScan(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, sql := range []string{
		`ALTER TABLE relay_jobs DISABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, run_at) VALUES ('bad', '-infinity')`,
		`INSERT INTO relay_jobs (kind, created_at) VALUES ('bad', 'infinity')`,
		`INSERT INTO relay_jobs (kind, attempt, max_attempts) VALUES ('bad', 5, 3)`,
		`INSERT INTO relay_jobs (kind, tags) VALUES ('bad', ARRAY['t', NULL])`,
		`ALTER TABLE relay_jobs ENABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, args) SELECT 'plain', jsonb_build_object('n', i) FROM generate_series(1, 5) AS i`,
		`INSERT INTO relay_jobs (kind, priority, ordering_key, tags, metadata, args)
		 VALUES ('keyed', 3, 'key-é', '{a,"b c"}', '{"traceparent": "00-x", "n": [1, 2]}', '{"s": "ü\u00e9"}')`,
		`INSERT INTO relay_jobs (kind, tags, max_attempts, run_at) VALUES ('other kind', '{x}', 1, now() - interval '1 day')`,
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rows, err := tx.Query(ctx, sqlClaim, DefaultQueue, 100, 30000, "decoder", leaseToken(uuid.New()))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	fds := rows.FieldDescriptions()
	if !claimedWireFormat(fds) {
		t.Fatalf("the claim's result is not in the format the decoder reads: %+v", fds)
	}
	d := claimDecoder{fds: fds}
	n := 0
	for rows.Next() {
		n++
		var wire, scanned claimedRow
		if !d.decode(rows.RawValues(), &wire) {
			t.Fatalf("row %d: the decoder gave it to Scan", n)
		}
		if err := rows.Scan(scanned.dest()...); err != nil {
			t.Fatal(err)
		}
		a, aerr := wire.job("decoder")
		b, berr := scanned.job("decoder")
		if fmt.Sprint(aerr) != fmt.Sprint(berr) {
			t.Errorf("job %d: decoder's error %v, Scan's %v", b.ID, aerr, berr)
		}
		if aerr != nil {
			// Undecodable rows fill the times they lack with now.
			a.CreatedAt, a.AttemptedAt = b.CreatedAt, b.AttemptedAt
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("job %d: decoder's row\n%+v\nScan's\n%+v", b.ID, *a, *b)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 11 {
		t.Fatalf("claimed %d rows, want 11", n)
	}
}

// A result in the text format (the simple protocol) is read by Scan.
func TestClaimDecoderLeavesTextResultsToScan(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, tags) VALUES ('plain', '{a}')`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, sqlClaim, pgx.QueryExecModeSimpleProtocol, DefaultQueue, 10, 30000, "decoder", uuid.New().String())
	if err != nil {
		t.Fatal(err)
	}
	if claimedWireFormat(rows.FieldDescriptions()) {
		rows.Close()
		t.Fatal("a text-format result was taken for the decoder's")
	}
	got, err := scanClaimed(rows, "decoder")
	if err != nil || len(got) != 1 || got[0].Kind != "plain" || len(got[0].Tags) != 1 || got[0].undecodable != nil {
		t.Fatalf("scanClaimed on a text result: %+v, %v", got, err)
	}
}
