package core

import (
	"context"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/relayq/relay/testkit/testdb"
)

// A claim's now() (its attempted_at) is the start of its transaction,
// which comes before the snapshot its statement reads: a claim whose
// transaction began before the completion of its key's previous job, and
// whose statement ran after that completion committed, takes the next job
// in order and records an attempted_at earlier than the previous job's
// finalized_at (the completion's own now()). That is what bench's old
// order check (attempted_at against the previous finalized_at) counted
// once under load; here the claim's transaction is held open between its
// Parse, which starts it, and its Bind and Execute. Before the completion
// the same claim takes nothing: the key's head check is what orders them.
func TestClaimNowPrecedesItsSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	first := enqueueKeyed(t, pool, "k")
	second := enqueueKeyed(t, pool, "k")
	head := claimSQL(t, pool, 10)
	if len(head) != 1 || head[0].ID != first {
		t.Fatalf("claimed %v, want the key's head %d only", claimedIDs(head), first)
	}
	if rows := claimSQL(t, pool, 10); len(rows) != 0 {
		t.Fatalf("claimed %v while the head runs", claimedIDs(rows))
	}

	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	hc, err := conn.PgConn().Hijack()
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Conn.Close()
	fe := hc.Frontend
	receive := func() pgproto3.BackendMessage {
		t.Helper()
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("claim: %s", e.Message)
		}
		return msg
	}
	// Parse starts the claim's implicit transaction: its now() is fixed.
	fe.Send(&pgproto3.Parse{Query: sqlClaim})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, ok := receive().(*pgproto3.ParseComplete); !ok {
		t.Fatal("no ParseComplete")
	}
	// The head's completion, in a transaction that starts and commits
	// after the claim's began.
	completeSQL(t, pool, head...)
	token := uuid.New()
	fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte(DefaultQueue), []byte("10"), []byte("60000"), []byte("test"), []byte(token.String())}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var claimed []int64
	for ready := false; !ready; {
		switch m := receive().(type) {
		case *pgproto3.DataRow:
			id, err := strconv.ParseInt(string(m.Values[0]), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			claimed = append(claimed, id)
		case *pgproto3.ReadyForQuery:
			ready = true
		}
	}
	if len(claimed) != 1 || claimed[0] != second {
		t.Fatalf("the claim took %v, want the key's next job %d (the completion committed before its statement ran)", claimed, second)
	}
	var claimedAt, finishedAt string
	var before bool
	if err := pool.QueryRow(ctx, `
		SELECT n.attempted_at::text, p.finalized_at::text, n.attempted_at < p.finalized_at
		FROM relay_jobs AS n, relay_jobs AS p WHERE n.id = $1 AND p.id = $2`, second, first).Scan(&claimedAt, &finishedAt, &before); err != nil {
		t.Fatal(err)
	}
	if !before {
		t.Fatalf("job %d's claim now() %s is not before job %d's completion's now() %s", second, claimedAt, first, finishedAt)
	}
	t.Logf("job %d claimed at now() %s, before job %d finished at now() %s, and in order", second, claimedAt, first, finishedAt)
}
