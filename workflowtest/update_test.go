package workflowtest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
	"github.com/relayq/relay/workflowtest"
)

// Updates sent at virtual times after a day's sleep: one the run's Validate
// refuses fails alone (its caller gets ErrUpdateRejected, nothing is
// recorded, the wait goes on), the next is applied and answered, and the
// run completes with the state the handler changed.
func TestUpdatesAtVirtualTimes(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	type result struct {
		Total  int
		Waited time.Duration
	}
	wf := workflow.MustRegister(env.Registry(), "cart", func(wctx workflow.Context, _ struct{}) (result, error) {
		before := workflow.Now(wctx, "before")
		if err := workflow.Sleep(wctx, "settle", 24*time.Hour); err != nil {
			return result{}, err
		}
		total := 0
		ok, err := workflow.HandleUpdate(wctx, "add", func(_ workflow.Context, n int) (int, error) {
			total += n
			return total, nil
		}, &workflow.UpdateOpts[int]{Timeout: 72 * time.Hour, Validate: func(n int) error {
			if n < 0 {
				return fmt.Errorf("cannot add %d", n)
			}
			return nil
		}})
		if err != nil || !ok {
			return result{}, fmt.Errorf("handled %v: %w", ok, err)
		}
		return result{Total: total, Waited: workflow.Now(wctx, "after").Sub(before)}, nil
	})
	refused := env.UpdateAfter(30*time.Hour, "cart-1", "add", -1)
	added := env.UpdateAfter(36*time.Hour, "cart-1", "add", 5)
	got, run := workflowtest.Run(env, wf, struct{}{}, &workflow.StartOpts{ID: "cart-1"})
	if run.State != workflow.StateCompleted || got.Total != 5 || got.Waited < 35*time.Hour || got.Waited >= 72*time.Hour {
		t.Fatalf("run %s (%s): %+v, want total 5 after 36h", run.State, run.Error, got)
	}
	_, err := workflowtest.UpdateAnswer[int](refused)
	var uerr *workflow.UpdateError
	if !errors.Is(err, workflow.ErrUpdateRejected) || !errors.As(err, &uerr) || !strings.Contains(uerr.Message, "cannot add -1") {
		t.Fatalf("refused update: %v, want ErrUpdateRejected naming Validate's error", err)
	}
	if n, err := workflowtest.UpdateAnswer[int](added); err != nil || n != 5 {
		t.Fatalf("added update: %d, %v; want 5", n, err)
	}
	var updates []string
	for _, s := range run.Steps {
		if strings.HasPrefix(s.Key, "update:") {
			updates = append(updates, s.Key)
		}
	}
	if len(updates) != 1 || updates[0] != "update:add#1" {
		t.Fatalf("update steps %v, want only update:add#1 (the refused request recorded nothing)", updates)
	}
}

// An update read before it is answered fails the test, naming why: before
// its virtual time it is not sent; sent to a run that waits on a timer
// before its HandleUpdate, it is pending until the run is driven there.
func TestUpdateAnswerBeforeItIsAnswered(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	env := workflowtest.New(rec, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "late-handler", func(wctx workflow.Context, _ struct{}) (string, error) {
		if err := workflow.Sleep(wctx, "first", 48*time.Hour); err != nil {
			return "", err
		}
		_, err := workflow.HandleUpdate(wctx, "ping", func(_ workflow.Context, s string) (string, error) { return s + "!", nil }, nil)
		return "", err
	})
	u := env.UpdateAfter(24*time.Hour, "late-1", "ping", "hi")
	if _, err := workflow.Start(t.Context(), env.Pool(), wf, struct{}{}, &workflow.StartOpts{ID: "late-1"}); err != nil {
		t.Fatal(err)
	}
	env.Settle()
	answerOn(rec, u)
	if !strings.Contains(rec.msg, "not sent yet") {
		t.Fatalf("read before its time: %q, want it not sent yet", rec.msg)
	}
	env.AdvanceBy(25 * time.Hour) // sent at 24h; the run sleeps until 48h
	answerOn(rec, u)
	if !strings.Contains(rec.msg, "not answered yet") {
		t.Fatalf("read while pending: %q, want it not answered yet", rec.msg)
	}
	env.AdvanceBy(24 * time.Hour)
	if s, err := workflowtest.UpdateAnswer[string](u); err != nil || s != "hi!" {
		t.Fatalf("answer after the sleep: %q, %v; want hi!", s, err)
	}
}

// answerOn reads u's answer in a goroutine of its own, as a test's Fatal
// ends it, into rec's message.
func answerOn(rec *fatalRecorder, u *workflowtest.SentUpdate) {
	rec.msg = ""
	done := make(chan struct{})
	go func() {
		defer close(done)
		workflowtest.UpdateAnswer[string](u) //nolint:errcheck // the test reads rec's message
	}()
	<-done
}
