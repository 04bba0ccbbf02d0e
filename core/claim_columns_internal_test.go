package core

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// claimStatements are every statement that claims jobs, the ones whose
// rows scanClaimed reads (TestEveryClaimStatementIsListed keeps the list
// whole).
func claimStatements() map[string]string {
	return map[string]string{
		"sqlClaim":          sqlClaim,
		"sqlClaimSync":      sqlClaimSync,
		"sqlClaimAfter":     sqlClaimAfter,
		"sqlClaimAfterSync": sqlClaimAfterSync,
		"sqlClaimFrom":      sqlClaimFrom,
		"sqlClaimFromSync":  sqlClaimFromSync,
		"sqlClaimLimited":   sqlClaimLimited,
		"sqlClaimKnown":     sqlClaimKnown,
	}
}

// Every claim statement returns the columns claimDecoder and
// claimedRow.dest read, in their order and with the types claimedColumns
// names: PostgreSQL's description of each prepared statement is checked,
// not only its text, so a RETURNING list that drifted from the decoder
// (a column added, dropped, moved or of another type) fails here.
func TestClaimStatementsReturnWhatTheDecoderReads(t *testing.T) {
	t.Parallel()
	// The order claimedRow.dest and claimDecoder.decode read the columns in.
	names := []string{"id", "kind", "queue", "priority", "attempt", "max_attempts", "run_at",
		"created_at", "attempted_at", "args", "metadata", "lease_token", "coalesce", "tags"}
	if len(names) != len(claimedColumns) || len(names) != len((&claimedRow{}).dest()) {
		t.Fatalf("%d names, %d claimedColumns, %d dest: they must agree", len(names), len(claimedColumns), len((&claimedRow{}).dest()))
	}
	pool := testdb.New(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, sql := range claimStatements() {
		if n := strings.Count(sql, "RETURNING"); n != 1 || !strings.HasSuffix(sql, "\n"+claimReturning) {
			t.Errorf("%s does not end with claimReturning (%d RETURNING):\n%s", name, n, sql)
		}
		if !strings.Contains(sql, "SET state            = 'claimed',\n") {
			t.Errorf("%s is not built by claimUpdate:\n%s", name, sql)
		}
		sd, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
		if err != nil {
			t.Errorf("%s: prepare: %v", name, err)
			continue
		}
		if len(sd.Fields) != len(claimedColumns) {
			t.Errorf("%s returns %d columns, the decoder reads %d", name, len(sd.Fields), len(claimedColumns))
			continue
		}
		for i, fd := range sd.Fields {
			if fd.Name != names[i] || fd.DataTypeOID != claimedColumns[i].oid {
				t.Errorf("%s: column %d is %s (type %d), the decoder reads %s (type %d) there",
					name, i, fd.Name, fd.DataTypeOID, names[i], claimedColumns[i].oid)
			}
		}
	}
}

// No statement of core's claims jobs without claimUpdate: the only text
// in core's source that sets a job claimed is claimUpdate's, so a new
// claim statement written out in full (whose RETURNING could drift from
// the decoder) fails here until it uses claimUpdate and joins
// claimStatements.
func TestEveryClaimStatementIsListed(t *testing.T) {
	t.Parallel()
	claims := regexp.MustCompile(`(?i)SET\s+state\s*=\s*'claimed'|RETURNING\s+j\.id,\s*j\.kind,\s*j\.queue`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range claims.FindAllIndex(src, -1) {
			n++
			if f != "queries.go" || !strings.Contains(string(src[max(0, m[0]-400):m[0]]), "func claimUpdate(") {
				t.Errorf("%s:%d claims jobs outside claimUpdate: %q", f, 1+strings.Count(string(src[:m[0]]), "\n"), src[m[0]:m[1]])
			}
		}
	}
	if n != 1 {
		t.Errorf("%d texts in core set a job claimed, want 1 (claimUpdate's)", n)
	}
	// The listed statements are the ones built by claimUpdate.
	src, err := os.ReadFile("queries.go")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Count(string(src), "claimUpdate(")-1, len(claimStatements())-4; got != want {
		// claimStatement builds four listed statements, walkClaimStatement
		// two; claimUpdate's own definition is not a call.
		t.Errorf("queries.go calls claimUpdate %d times, claimStatements lists %d statements (want %d calls)", got, len(claimStatements()), want)
	}
}
