package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

// Tags set at start and added by the workflow are stored once each, in
// order; List filters by them (every tag asked for); AddTags is a
// checkpoint a replay skips (the execution after a sleep adds nothing
// twice and writes no second marker).
func TestRunTags(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var executions atomic.Int32
	wf := workflow.MustRegister(b.reg, "tagged", func(wctx workflow.Context, customer string) (int, error) {
		if err := workflow.AddTags(wctx, "customer:"+customer, "tenant:acme"); err != nil {
			return 0, err
		}
		if _, err := workflow.Step(wctx, "work", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		// A sleep ends the execution: the next one replays the tags.
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return 0, err
		}
		executions.Add(1)
		return 1, nil
	})
	b.start()
	var ids []string
	for i, order := range []string{"o-1", "o-2", "o-3"} {
		h, err := workflow.Start(ctx, b.pool, wf, fmt.Sprintf("c-%d", i%2), &workflow.StartOpts{
			ID: order, Tags: []string{"order:" + order, "tenant:acme", "order:" + order}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Result(ctx, b.pool); err != nil {
			t.Fatalf("run %s: %v", order, err)
		}
		ids = append(ids, h.ID)
	}
	run, err := workflow.Get(ctx, b.pool, "o-1")
	if err != nil {
		t.Fatal(err)
	}
	if run.Executions < 2 {
		t.Errorf("%d executions, want the tags replayed by a second", run.Executions)
	}
	if want := []string{"order:o-1", "tenant:acme", "customer:c-0"}; !slices.Equal(run.Tags, want) {
		t.Errorf("tags %q, want %q", run.Tags, want)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'o-1' AND kind = 'tags'`); n != 1 {
		t.Errorf("%d tags markers, want 1", n)
	}
	list := func(tags ...string) []string {
		t.Helper()
		runs, err := workflow.List(ctx, b.pool, &workflow.ListOpts{Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range runs {
			got = append(got, r.ID)
		}
		slices.Sort(got)
		return got
	}
	for _, c := range []struct {
		tags []string
		want []string
	}{
		{[]string{"order:o-2"}, []string{"o-2"}},
		{[]string{"tenant:acme"}, ids},
		{[]string{"tenant:acme", "customer:c-0"}, []string{"o-1", "o-3"}},
		{[]string{"customer:c-1", "order:o-1"}, nil},
		{nil, ids},
	} {
		if got := list(c.tags...); !slices.Equal(got, c.want) {
			t.Errorf("List(tags %q) = %q, want %q", c.tags, got, c.want)
		}
	}
}

// A bad tag at start is an error naming it, and nothing is written; a
// workflow's AddTags over the limit returns ErrInvalidTag to the workflow
// (which goes on) and adds nothing.
func TestRunTagsBadInput(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var addErr atomic.Value
	wf := workflow.MustRegister(b.reg, "tags-bad", func(wctx workflow.Context, _ int) (int, error) {
		var many []string
		for i := range workflow.MaxTags {
			many = append(many, fmt.Sprintf("t%d", i))
		}
		err := workflow.AddTags(wctx, many...) // one more than the run can carry with its start tag
		addErr.Store(fmt.Sprint(err))
		if !errors.Is(err, workflow.ErrInvalidTag) {
			return 0, fmt.Errorf("AddTags over the limit: %v", err)
		}
		if err := workflow.AddTags(wctx, ""); !errors.Is(err, workflow.ErrInvalidTag) {
			return 0, fmt.Errorf("AddTags of an empty tag: %v", err)
		}
		return 1, workflow.AddTags(wctx, "ok")
	})
	for _, c := range []struct {
		tags []string
		want string
	}{
		{[]string{""}, "a tag is empty"},
		{[]string{strings.Repeat("x", workflow.MaxTagBytes+1)}, "256 bytes, over 255"},
		{[]string{"a\x00b"}, "NUL"},
		{[]string{"\xff"}, "not valid UTF-8"},
		{make33(), "33 tags, at most 32"},
	} {
		_, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{Tags: c.tags})
		if !errors.Is(err, workflow.ErrInvalidTag) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("start with tags %q: %v, want ErrInvalidTag saying %q", c.tags, err, c.want)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs`); n != 0 {
		t.Fatalf("%d runs written by refused starts", n)
	}
	if _, err := workflow.List(ctx, b.pool, &workflow.ListOpts{Tags: []string{""}}); !errors.Is(err, workflow.ErrInvalidTag) {
		t.Errorf("List with an empty tag: %v", err)
	}
	b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "r", Tags: []string{"start"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Result(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	if s, _ := addErr.Load().(string); !strings.Contains(s, "would carry 33 tags, at most 32") {
		t.Errorf("AddTags over the limit said %q", s)
	}
	run, err := workflow.Get(ctx, b.pool, "r")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(run.Tags, []string{"start", "ok"}) {
		t.Errorf("tags %q, want [start ok]", run.Tags)
	}
}

func make33() []string {
	var out []string
	for i := range 33 {
		out = append(out, fmt.Sprint("tag-", i))
	}
	return out
}
