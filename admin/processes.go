package admin

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/relayq/relay/internal/liveness"
)

// Process is a live Relay process: a worker or other client, a scheduler,
// an outbox dispatcher or relay serve, as it recorded itself at start and
// renews by heartbeat. A process stopped with Stop is gone at once; a killed
// one is listed until its last heartbeat is older than its liveness
// timeout (ExpiresAt).
type Process struct {
	ID   string `json:"id" doc:"The entry's id (one per started client, scheduler, dispatcher or server)"`
	Role string `json:"role" enum:"worker,client,scheduler,dispatcher,serve" doc:"worker: a client with queues; client: one without (enqueues, rescues, cleans)"`
	Name string `json:"name,omitempty" doc:"A client's ID: the attempted_by of the jobs it runs"`
	// Namespace and Declares: a scheduler's schedules or a dispatcher's
	// subscriptions, which this process keeps alive.
	Namespace string         `json:"namespace,omitempty"`
	Declares  []string       `json:"declares"`
	Host      string         `json:"host"`
	PID       int            `json:"pid"`
	Version   string         `json:"version" doc:"The main module's path and version (and VCS revision), and Relay's version when a dependency"`
	Queues    []ProcessQueue `json:"queues" doc:"The queues a worker serves, by name"`
	StartedAt time.Time      `json:"started_at"`
	// LastSeenAt is the last heartbeat; the process heartbeats every
	// quarter of its liveness timeout.
	LastSeenAt             time.Time `json:"last_seen_at"`
	LivenessTimeoutSeconds float64   `json:"liveness_timeout_seconds"`
	ExpiresAt              time.Time `json:"expires_at" doc:"When the entry stops being live without another heartbeat"`
}

// ProcessQueue is a queue a worker process serves and its slots (jobs it
// runs at once).
type ProcessQueue struct {
	Name  string `json:"name"`
	Slots int    `json:"slots"`
}

type listProcessesInput struct {
	Role  string `query:"role" enum:"worker,client,scheduler,dispatcher,serve" doc:"Only processes of this role"`
	Queue string `query:"queue" maxLength:"128" doc:"Only workers serving this queue"`
}

type listProcessesOutput struct {
	Body struct {
		Items []Process `json:"items" doc:"Every live process, by role, host and start (processes are few: no paging)"`
	}
}

func (s *server) registerProcesses(api huma.API) {
	huma.Register(api, op("list-processes", http.MethodGet, "/v1/processes",
		"List the live processes: workers with their queues and slots, schedulers, dispatchers, servers", "processes"),
		func(ctx context.Context, in *listProcessesInput) (*listProcessesOutput, error) {
			ps, err := s.processes(ctx)
			if err != nil {
				return nil, s.internalError("list processes", err)
			}
			out := &listProcessesOutput{}
			out.Body.Items = []Process{}
			for _, p := range ps {
				if (in.Role == "" || p.Role == in.Role) && (in.Queue == "" || serves(p, in.Queue)) {
					out.Body.Items = append(out.Body.Items, p)
				}
			}
			return out, nil
		})
}

// processes reads the live processes (on the read pool: a list).
func (s *server) processes(ctx context.Context) ([]Process, error) {
	list, err := liveness.List(ctx, s.read)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(list))
	for _, i := range list {
		p := Process{ID: i.ID, Role: i.Role, Name: i.Name, Namespace: i.Namespace, Declares: i.Declares,
			Host: i.Host, PID: i.PID, Version: i.Version, Queues: []ProcessQueue{}, StartedAt: i.StartedAt,
			LastSeenAt: i.LastSeenAt, LivenessTimeoutSeconds: i.Timeout.Seconds(), ExpiresAt: i.ExpiresAt}
		if p.Declares == nil {
			p.Declares = []string{}
		}
		for q, n := range i.Queues {
			p.Queues = append(p.Queues, ProcessQueue{Name: q, Slots: n})
		}
		sort.Slice(p.Queues, func(a, b int) bool { return p.Queues[a].Name < p.Queues[b].Name })
		out = append(out, p)
	}
	return out, nil
}

func serves(p Process, queue string) bool {
	for _, q := range p.Queues {
		if q.Name == queue {
			return true
		}
	}
	return false
}
