package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"
)

// proofSink is the outside observer of `relay prove queue`: the handlers of
// the worker processes report each attempt's start and end to it over HTTP
// (not through PostgreSQL, and not through the partition proxy), and it
// timestamps them on the prover's monotonic clock. A handler reports its
// start before doing anything and its end before it returns (and before its
// own bookkeeping in the database), so the window the sink sees contains
// the window in which the handler could act on the world.
type proofSink struct {
	srv   *http.Server
	ln    net.Listener
	epoch time.Time

	mu      sync.Mutex
	windows map[sinkKey]*sinkWindow
	kills   map[string]time.Duration // worker id → when its process was SIGKILLed
	stops   []sinkStop               // SIGSTOP..SIGCONT of worker processes
}

type sinkKey struct {
	job     int64
	attempt int
	worker  string
}

type sinkWindow struct {
	start, end time.Duration
	ended      bool
}

type sinkStop struct {
	worker   string
	from, to time.Duration
}

func startProofSink() (*proofSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("prove: sink: %w", err)
	}
	s := &proofSink{ln: ln, epoch: time.Now(), windows: map[sinkKey]*sinkWindow{}, kills: map[string]time.Duration{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(ln) //nolint:errcheck // ends with Close
	return s, nil
}

// URL is where handlers report.
func (s *proofSink) URL() string { return "http://" + s.ln.Addr().String() + "/event" }

func (s *proofSink) Close() { s.srv.Close() }

func (s *proofSink) now() time.Duration { return time.Since(s.epoch) }

func (s *proofSink) serve(w http.ResponseWriter, r *http.Request) {
	at := s.now()
	q := r.URL.Query()
	job, err1 := strconv.ParseInt(q.Get("job"), 10, 64)
	attempt, err2 := strconv.Atoi(q.Get("attempt"))
	if err1 != nil || err2 != nil || q.Get("worker") == "" {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	k := sinkKey{job, attempt, q.Get("worker")}
	s.mu.Lock()
	switch q.Get("e") {
	case "start":
		if s.windows[k] == nil {
			s.windows[k] = &sinkWindow{start: at}
		}
	case "end":
		if win := s.windows[k]; win != nil && !win.ended {
			win.end, win.ended = at, true
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// killed notes that worker's process is gone (after its Wait).
func (s *proofSink) killed(worker string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kills[worker] = s.now()
}

// stopped notes that worker's process was SIGSTOPped; the returned function
// notes its SIGCONT.
func (s *proofSink) stopped(worker string) func() {
	from := s.now()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.stops = append(s.stops, sinkStop{worker, from, s.now()})
	}
}

// overlaps counts pairs of attempts of one job whose windows, as the sink
// saw them, overlap. A window ends at its end report, else at its process's
// SIGKILL, else never. An attempt whose process was SIGSTOPped during its
// window is left out: nothing can run in a stopped process to cancel its
// handler, so no library can keep it from overlapping (the database audit
// and the fence cover it). It also returns the windows counted.
func (s *proofSink) overlaps() (overlaps, windows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	const never = time.Duration(1<<63 - 1)
	byJob := map[int64][][2]time.Duration{}
	for k, w := range s.windows {
		end := never
		if w.ended {
			end = w.end
		} else if at, ok := s.kills[k.worker]; ok && at >= w.start {
			end = at
		}
		stopped := false
		for _, st := range s.stops {
			if st.worker == k.worker && st.from < end && w.start < st.to {
				stopped = true
			}
		}
		if stopped {
			continue
		}
		byJob[k.job] = append(byJob[k.job], [2]time.Duration{w.start, end})
		windows++
	}
	for job, ws := range byJob {
		if len(ws) > 1 && os.Getenv("RELAY_PROVE_DEBUG") != "" {
			fmt.Fprintln(os.Stderr, "sink: job", job, ws)
		}
		for i := range ws {
			for j := i + 1; j < len(ws); j++ {
				if ws[i][0] < ws[j][1] && ws[j][0] < ws[i][1] {
					overlaps++
				}
			}
		}
	}
	return overlaps, windows
}

// sinkClient reports a handler's events to a proofSink.
type sinkClient struct {
	url    string
	worker string
	http   *http.Client
}

func newSinkClient(u, worker string) *sinkClient {
	if u == "" {
		return nil
	}
	return &sinkClient{url: u, worker: worker, http: &http.Client{Timeout: 2 * time.Second}}
}

// report sends one event, retrying briefly: a lost start would hide an
// attempt from the audit, so the handler gives up (and fails the attempt)
// rather than run unobserved.
func (s *sinkClient) report(event string, job int64, attempt int) error {
	if s == nil {
		return nil
	}
	q := url.Values{"e": {event}, "job": {strconv.FormatInt(job, 10)}, "attempt": {strconv.Itoa(attempt)}, "worker": {s.worker}}
	var err error
	for try := 0; try < 5; try++ {
		var resp *http.Response
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"?"+q.Encode(), nil)
		resp, err = s.http.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
			err = errors.New(resp.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("report %s to the proof's sink: %w", event, err)
}
