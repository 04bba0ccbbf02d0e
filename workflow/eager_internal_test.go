package workflow

import (
	"strings"
	"testing"

	"github.com/relayq/relay/core"
)

// The run's insert reads its job's id with the expression the core
// documents for the statements of an InsertClaimed batch.
func TestEagerInsertRunNamesTheJob(t *testing.T) {
	if !strings.Contains(sqlEagerInsertRun, core.InsertedJobID) {
		t.Fatalf("sqlEagerInsertRun does not use core.InsertedJobID %s:\n%s", core.InsertedJobID, sqlEagerInsertRun)
	}
}
