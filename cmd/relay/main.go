// Command relay is Relay's command line: apply migrations, run the demo,
// prove and bench, serve the admin API and dashboard, mint tokens, and
// operate a running server (jobs, runs, schedules, queues) over its API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/relayq/relay/bench"
)

const usage = `relay — a job queue and durable workflows on PostgreSQL

Usage:
  relay migrate [--database-url URL]   apply pending migrations
  relay demo    [--database-url URL]   run the demo: jobs, workflows, a schedule, outbox events
                                       (its own local PostgreSQL when no URL); then
                                       relay demo --dashboard opens the dashboard on them
  relay prove queue [flags]            prove no job is lost or its effect duplicated
                                       under kill -9, SIGTERM and database faults
                                       (relay prove queue -h lists the flags)
  relay prove scheduler [flags]        prove every fire time of a schedule gets exactly
                                       one job across processes under kill -9
  relay prove idempotency [flags]      prove each job's database effect happens once and
                                       its outside call keeps one token, under kill -9
  relay prove outbox [flags]           prove published events reach their subscribers once,
                                       in order per key, under kill -9
  relay prove workflow [flags]         prove every workflow run reaches its outcome with each
                                       step's effect made once, under kill -9 and SIGSTOP
  relay bench [flags]                  measure throughput and latency: a burn-down of
                                       --jobs, or --rate jobs/s for --duration
                                       (relay bench -h lists the flags)
  relay serve   [flags]                serve the admin API, /metrics, /healthz, /readyz
                                       (relay serve -h lists the flags; docs/admin.md)
  relay token   [flags]                print a development token signed with $RELAY_JWT_SECRET

Operating a running relay serve (over its admin API; relay <group> --help):
  relay jobs list|show|retry|cancel|requeue|delete|bulk
                                                       find, read and change jobs
  relay runs list|show|history|signal|cancel|terminate|retry
                                                       workflow runs, with their step timeline
  relay schedules list|show|trigger|pause|resume       cron schedules and their next fires
  relay queues list|pause|resume                       queues: backlog, pause
  relay processes                                      the live processes: workers, schedulers, servers
These take --url (default $RELAY_URL, else http://127.0.0.1:8080), --token
(default $RELAY_TOKEN: relay token mints one) and --output table|json.

The database URL defaults to $DATABASE_URL.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// run dispatches a command line and returns the exit code: 0 on success
// and for help, 2 for a usage error (printed once, by parseFlags or here),
// 1 for a failure, printed as "relay <command>: <error>".
func run(args []string) int {
	if len(args) < 1 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	name := args[0]
	var err error
	switch name {
	case "migrate":
		err = runMigrate(ctx, args[1:])
	case "demo":
		err = runDemo(ctx, args[1:])
	case "prove":
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			name = "prove " + args[1]
		}
		err = runProve(ctx, args[1:])
	case "prove-worker":
		err = runProveWorker(ctx, args[1:])
	case "bench":
		err = runBench(ctx, args[1:])
	case "bench-worker":
		err = bench.RunChild(ctx, args[1:], []bench.System{bench.Relay{}, bench.Floor{}})
	case "prove-outbox-worker":
		err = runProveOutboxWorker(ctx, args[1:])
	case "prove-idem-worker":
		err = runProveIdemWorker(ctx, args[1:])
	case "prove-scheduler":
		err = runProveSchedulerProcess(ctx, args[1:])
	case "prove-workflow-worker":
		err = runProveWorkflowWorker(ctx, args[1:])
	case "serve":
		err = runServe(ctx, args[1:])
	case "token":
		err = runToken(args[1:])
	case "jobs", "runs", "schedules", "queues":
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			name += " " + args[1]
		}
		err = map[string]func(context.Context, []string) error{
			"jobs": runJobs, "runs": runRuns, "schedules": runSchedules, "queues": runQueues,
		}[args[0]](ctx, args[1:])
	case "processes":
		err = runOp(ctx, "processes", processesCommand(), args[1:])
	case "help", "-h", "--help", "-help":
		if name == "help" && len(args) > 1 { // relay help demo = relay demo --help
			return run(append(args[1:], "--help"))
		}
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "relay: unknown command %q\n\n%s", name, usage)
		return 2
	}
	return exitCode(name, err)
}

// errHelp is returned when help was asked for and printed.
var errHelp = errors.New("help requested")

// usageError is a command line that cannot run; its message is printed
// before it is returned.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

// exitCode prints err, if it needs printing, and maps it to an exit code.
func exitCode(name string, err error) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelp), errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	}
	// The command's own prefix ("demo: …", "prove: …") is replaced by the
	// full one, so every failure names the command that failed once.
	msg := err.Error()
	for _, p := range []string{name + ": ", strings.Fields(name)[0] + ": "} {
		msg = strings.TrimPrefix(msg, p)
	}
	fmt.Fprintf(os.Stderr, "relay %s: %s\n", name, msg)
	return 1
}

// parseFlags parses a command's flags. Help (-h, --help) prints the
// command's usage and flags to stdout and returns errHelp; a bad flag
// prints its error and the usage to stderr, once, and returns a
// usageError. Every command parses through it (or parseArgs), so `relay
// <command> --help` lists the real flag set (the docs test reads it from
// there).
func parseFlags(fs *flag.FlagSet, args []string) error {
	_, err := parseArgs(fs, args, nil)
	return err
}

// parseArgs is parseFlags for a command that takes the positional
// arguments named (relay jobs show ID; "[JSON]" is an optional last one,
// "" when not given): flags may come before, between and after them, and
// everything after "--" is positional. Too few, too many or an empty
// required one is a usage error.
func parseArgs(fs *flag.FlagSet, args []string, names []string) ([]string, error) {
	name := fs.Name()
	printUsage := func(w io.Writer) {
		if f := fs.Lookup("database-url"); f != nil && f.DefValue != "" {
			// The default came from $DATABASE_URL: name it, never print
			// it (it may hold a password).
			f.DefValue = "$DATABASE_URL"
		}
		if f := fs.Lookup("url"); f != nil && os.Getenv(apiURLEnv) != "" {
			f.DefValue = "$" + apiURLEnv
		}
		if f := fs.Lookup("token"); f != nil && f.DefValue != "" {
			f.DefValue = "$" + apiTokenEnv // a credential, never printed
		}
		fs.SetOutput(w)
		fmt.Fprintf(w, "Usage: relay %s [flags]\n\nFlags:\n", strings.Join(append([]string{name}, names...), " "))
		fs.PrintDefaults()
	}
	fail := func(err error) ([]string, error) {
		fmt.Fprintf(os.Stderr, "relay %s: %v\n\n", name, err)
		printUsage(os.Stderr)
		return nil, usageError{err}
	}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	flagArgs, rest := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		flagArgs, rest = args[:i], args[i+1:]
	}
	var pos []string
	for {
		err := fs.Parse(flagArgs)
		switch {
		case errors.Is(err, flag.ErrHelp):
			printUsage(os.Stdout)
			return nil, errHelp
		case err != nil:
			return fail(err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		flagArgs = fs.Args()[1:]
	}
	pos = append(pos, rest...)
	required := 0 // names in brackets ("[JSON]") are optional, and last
	for _, n := range names {
		if !strings.HasPrefix(n, "[") {
			required++
		}
	}
	switch {
	case len(pos) > len(names):
		return fail(fmt.Errorf("unexpected argument %q", pos[len(names)]))
	case len(pos) < required:
		return fail(fmt.Errorf("missing %s", strings.Join(names[len(pos):required], " ")))
	}
	for i, p := range pos {
		if p == "" && i < required {
			return fail(fmt.Errorf("empty %s", names[i]))
		}
	}
	return append(pos, make([]string, len(names)-len(pos))...), nil
}
