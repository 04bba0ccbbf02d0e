package main

import (
	"strconv"
	"strings"
	"testing"
)

// The queue proof on a primary and a synchronous standby (clusters the
// command starts itself), producers enqueueing over the run: the primary
// is stopped as a crash would stop it and the standby promoted mid-run;
// the workers, the producer and the prover carry on through the multi-host
// URL. The standby's link is cut for half a second before the primary
// stops, so the primary's commits of that half second wait for it: no
// acknowledged enqueue is lost, no job lost. The claims commit
// synchronously too, so no claim a handler runs under is missing on the
// new primary, and no attempt overlaps another, though the handlers act
// (as seen by the outside sink) before their first database write. The
// prover saw work resume.
func TestProveQueueFailoverSync(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	f := runProof(t, bin, "queue", "--failover", "--replication", "sync", "--replication-lag", "500ms", "--synchronous-claims", "--work-before-write",
		"--jobs", "600", "--processes", "2", "--concurrency", "4", "--job-time", "200ms", "--lease", "1s")
	for k, want := range map[string]string{"jobs": "600", "succeeded": "600", "lost": "0", "lost_enqueues": "0", "duplicate_effects": "0",
		"overlapping_executions": "0", "external_overlaps": "0", "replication": "sync"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	if s, _ := strconv.ParseFloat(strings.TrimSuffix(f["resumed_after"], "s"), 64); s <= 0 {
		t.Errorf("the prover did not see work resume after the failover: %v", f)
	}
}

// The same on an asynchronous standby held back by half a second (its link
// to the primary cut before the primary stops): enqueues the primary
// acknowledged in that half second are gone, and the proof counts them;
// every job that did reach the standby still runs to its end, its effect
// once. (Attempts may overlap here: asynchronous replication can lose a
// claim a handler runs under, and the proof reports that.)
func TestProveQueueFailoverAsyncLag(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	f := runProof(t, bin, "queue", "--failover", "--replication", "async", "--replication-lag", "500ms", "--jobs", "1500",
		"--processes", "2", "--concurrency", "4", "--job-time", "20ms", "--lease", "1s")
	for k, want := range map[string]string{"lost": "0", "duplicate_effects": "0", "replication": "async"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	if f["succeeded"] != f["jobs"] {
		t.Errorf("succeeded=%s of jobs=%s (%v)", f["succeeded"], f["jobs"], f)
	}
	lost, _ := strconv.Atoi(f["lost_enqueues"])
	jobs, _ := strconv.Atoi(f["jobs"])
	if lost == 0 || lost+jobs != 1500 {
		t.Errorf("lost_enqueues=%d, jobs=%d: want some acknowledged enqueues lost, the rest present (%v)", lost, jobs, f)
	}
}

// The workflow proof on a primary and a synchronous standby held back by
// half a second before the primary stops: every run ends as its input
// asked, each database effect once, no run forked, and no outside call
// made again with a second idempotency token (its stored token survived).
func TestProveWorkflowFailoverSync(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	f := runProof(t, bin, "workflow", "--failover", "--replication", "sync", "--replication-lag", "500ms", "--runs", "160",
		"--processes", "2", "--concurrency", "4", "--lease", "1s", "--sleep", "200ms", "--stall-bound", "40s")
	for k, want := range map[string]string{"runs": "160", "completed": "144", "compensated": "16", "lost": "0", "stalled": "0",
		"duplicate_tx_effects": "0", "forked_runs": "0", "order_violations": "0", "sends_with_two_tokens": "0", "replication": "sync"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	if s, _ := strconv.ParseFloat(strings.TrimSuffix(f["resumed_after"], "s"), 64); s <= 0 {
		t.Errorf("the prover did not see work resume after the failover: %v", f)
	}
}
