package core

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/relayq/relay/testkit/testdb"
)

// claimDecoder reads the rows a hostile writer or an unusual user leaves
// as Scan does (or leaves them to Scan): empty and NULL tag lists, a tag
// list with a lower bound other than 1, NULL tags among others, non-ASCII
// and very long kinds, queues and keys, timestamps at PostgreSQL's bounds,
// args of several megabytes, JSON escapes (a backslash-u sequence as text,
// escaped control characters), and
// kinds that alternate (the decoder reuses the last kind's string).
func TestClaimDecoderMatchesScanOnHostileRows(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	big := strings.Repeat("é", 3<<20)
	for _, sql := range []string{
		`ALTER TABLE relay_jobs DISABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, tags) VALUES ('t', '{}')`,
		`INSERT INTO relay_jobs (kind, tags) VALUES ('t', '[0:2]={a,b,c}')`,
		`INSERT INTO relay_jobs (kind, tags) VALUES ('t', '{NULL,NULL}')`,
		`INSERT INTO relay_jobs (kind, tags) VALUES ('t', '{{a,b},{c,d}}')`,
		`INSERT INTO relay_jobs (kind, run_at) VALUES ('far', '4714-11-24 00:00:00+00 BC')`,
		`INSERT INTO relay_jobs (kind, created_at, attempted_at) VALUES ('far', '294276-12-31 23:59:59.999999+00', '0001-01-01 00:00:00+00')`,
		`INSERT INTO relay_jobs (kind, created_at) VALUES ('far', '1969-12-31 23:59:59.999999+00')`,
		`INSERT INTO relay_jobs (kind, created_at) VALUES ('far', '1999-12-31 23:59:59.000001+00')`,
		`INSERT INTO relay_jobs (kind, priority) VALUES ('prio', 32767)`,
		`INSERT INTO relay_jobs (kind, attempt, max_attempts) VALUES ('att', 2147483646, 2147483647)`,
		`ALTER TABLE relay_jobs ENABLE TRIGGER USER`,
		`INSERT INTO relay_jobs (kind, ordering_key, tags) VALUES ('种类 ✓', '键-🔑', '{"ü", "a,b", "\"q\""}')`,
		`INSERT INTO relay_jobs (kind) VALUES ('` + strings.Repeat("ß", 255) + `')`,
		`INSERT INTO relay_jobs (kind, args) VALUES ('esc', '{"s": "\\u0000 as text", "c": "\u0001\t\n", "e": "\ud83d\ude00"}')`,
		`INSERT INTO relay_jobs (kind, args, metadata) VALUES ('big', jsonb_build_object('s', '` + big + `'), '{}')`,
		`INSERT INTO relay_jobs (kind) VALUES ('a'), ('b'), ('a'), ('a'), ('b')`,
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%.200s: %v", sql, err)
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
	n, toScan := 0, 0
	for rows.Next() {
		n++
		var wire, scanned claimedRow
		ok := d.decode(rows.RawValues(), &wire)
		if err := rows.Scan(scanned.dest()...); err != nil {
			t.Fatalf("row %d: Scan: %v", n, err)
		}
		if !ok {
			toScan++
			t.Logf("job %d (%.20s): left to Scan", scanned.id, scanned.kind)
			continue
		}
		a, aerr := wire.job("decoder")
		b, berr := scanned.job("decoder")
		if fmt.Sprint(aerr) != fmt.Sprint(berr) {
			t.Errorf("job %d: decoder's error %v, Scan's %v", b.ID, aerr, berr)
		}
		if aerr != nil {
			a.CreatedAt, a.AttemptedAt = b.CreatedAt, b.AttemptedAt
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("job %d (%.20s): decoder's row differs from Scan's:\n%.600v\n%.600v", b.ID, b.Kind, *a, *b)
		}
		if !reflect.DeepEqual(wire.tags, scanned.tags) {
			t.Errorf("job %d: decoder's tags %#v, Scan's %#v", b.ID, wire.tags, scanned.tags)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 19 {
		t.Fatalf("claimed %d rows, want 19", n)
	}
	if toScan > 1 {
		t.Errorf("%d rows left to Scan, want only the two-dimensional tag list", toScan)
	}
}
