package core

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

type oddArgs struct {
	Note string `json:"note"`
}

func (oddArgs) Kind() string { return "odd \"kind\" \\ é\n\x01✓" }

func TestOddStringsRoundTrip(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	q := "queue \"q\" \\ ü\t"
	res, err := Enqueue(ctx, pool, oddArgs{Note: "x\"y\\z\u2028"}, &EnqueueOpts{Queue: q, Unique: &UniqueOpts{Key: "k \"1\" \\"}})
	if err != nil {
		t.Fatal(err)
	}
	j, err := JobGet(ctx, pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	var args oddArgs
	if err := json.Unmarshal(j.EncodedArgs, &args); err != nil {
		t.Fatal(err)
	}
	if j.Kind != (oddArgs{}).Kind() || j.Queue != q || args.Note != "x\"y\\z\u2028" {
		t.Fatalf("round trip: kind %q queue %q note %q", j.Kind, j.Queue, args.Note)
	}
	if _, err := Enqueue(ctx, pool, oddArgs{}, &EnqueueOpts{Queue: "bad\xff"}); err == nil {
		t.Error("invalid UTF-8 queue accepted")
	}
}
