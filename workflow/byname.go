package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/eager"
)

// NamedHandle names a run started by name (StartByName), without its
// workflow's types: Result returns its output as JSON.
type NamedHandle struct {
	ID       string
	Workflow string
	// Existing reports that the run already existed (StartOpts.ID) and
	// nothing was started.
	Existing bool
}

// StartByName starts a run of the workflow registered under name by the
// processes that execute it, with input encoded as JSON, through db (a
// transaction is joined, as Start's): for a process that starts runs and
// registers nothing (an HTTP API in front of the workers), as Temporal's
// client starts a workflow by its name. input may be a json.RawMessage
// (used as is, once checked) or any value encoding/json encodes. Nothing
// here checks that some process registered name: a run of a name no
// running process knows waits, queued, until one does (the executions that
// meet it put it back and log it). The run's trace uses the global
// TracerProvider. A name that is empty, over 255 bytes or not UTF-8, and
// an input that does not encode or is over MaxPayloadBytes, are errors and
// nothing is written.
func StartByName(ctx context.Context, db core.DB, name string, input any, opts *StartOpts) (NamedHandle, error) {
	if name == "" || len(name) > 255 || !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0 {
		return NamedHandle{}, fmt.Errorf("workflow: start by name: name %q must be 1 to 255 bytes of UTF-8 without NUL", name)
	}
	var enc []byte
	switch v := input.(type) {
	case json.RawMessage:
		if len(v) == 0 {
			v = json.RawMessage("null")
		}
		if !json.Valid(v) {
			return NamedHandle{}, fmt.Errorf("workflow: start %s: %w", name, errInvalidInput)
		}
		if len(v) > MaxPayloadBytes {
			return NamedHandle{}, fmt.Errorf("workflow: start %s: %w: input is %d bytes", name, ErrTooLarge, len(v))
		}
		enc = v
	default:
		var err error
		if enc, err = encode("input of "+name, input); err != nil {
			return NamedHandle{}, fmt.Errorf("workflow: start %s: %w", name, err)
		}
	}
	id, existing, err := startRun(ctx, db, otel.Tracer(instrumentationName), eager.Producer{}, name, enc, opts, nil)
	if err != nil {
		return NamedHandle{}, err
	}
	return NamedHandle{ID: id, Workflow: name, Existing: existing}, nil
}

// Result waits for the run to finish and returns its output as JSON, or a
// *RunError, reading the run through db: polling (every few milliseconds
// at first, backing off to a second), holding no connection between
// polls. ctx bounds the wait. Decode the output with json.Unmarshal, or
// use ResultInto.
func (h NamedHandle) Result(ctx context.Context, db core.DB) (json.RawMessage, error) {
	return result[json.RawMessage](ctx, db, h.ID, nil)
}

// ResultInto is Result decoded into out (a pointer), as Temporal's
// WorkflowRun.Get.
func (h NamedHandle) ResultInto(ctx context.Context, db core.DB, out any) error {
	raw, err := h.Result(ctx, db)
	if err != nil {
		return err
	}
	if out == nil {
		return errors.New("workflow: result into nil")
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("workflow: result of %s: decode output into %T: %w", h.ID, out, err)
	}
	return nil
}
