package workflow

import (
	"strings"
	"testing"

	"github.com/relayq/relay/internal/eager"
)

// The run's insert reads its job's id with the expression the core
// documents for the statements of an eager insert batch.
func TestEagerInsertRunNamesTheJob(t *testing.T) {
	if !strings.Contains(sqlEagerInsertRun, eager.InsertedJobID) {
		t.Fatalf("sqlEagerInsertRun does not use eager.InsertedJobID %s:\n%s", eager.InsertedJobID, sqlEagerInsertRun)
	}
}
