package testdb

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// RunTwice runs an example's run function twice on one database, as a
// newcomer re-running it on a shared DATABASE_URL would, and checks each
// run's output with check: the second run must say what it found from the
// first ("left from a previous run") and give the same results.
func RunTwice(t *testing.T, run func(ctx context.Context, url string, out io.Writer) error, check func(t *testing.T, out string)) {
	t.Helper()
	url := URL(t)
	for i := range 2 {
		var b bytes.Buffer
		if err := run(context.Background(), url, &b); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, b.String())
		}
		if i == 1 && !strings.Contains(b.String(), "left from a previous run") {
			t.Errorf("the second run does not say what it found:\n%s", b.String())
		}
		check(t, b.String())
	}
}
