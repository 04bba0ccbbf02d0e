package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// The operator's commands (relay jobs, runs, schedules, queues) call a
// running relay serve over its admin API, as the dashboard does: they need
// its address and a token, never the database.

// opCommand is one command of a group: `relay <group> <name> <args>`.
type opCommand struct {
	name    string
	args    []string // the positional arguments' names, for usage: "ID"
	summary string
	// flags adds the command's own flags; the API's are added for it.
	flags func(fs *flag.FlagSet)
	run   func(ctx context.Context, c *opCall) error
}

// opCall is one command being run: its client, output format and
// positional arguments, and where it prints.
type opCall struct {
	api  *apiClient
	out  outputFormat
	args []string
	w    io.Writer
}

// runGroup runs `relay <group> <command> ...`: it finds the command,
// parses its flags and positional arguments, and runs it.
func runGroup(ctx context.Context, group, summary string, cmds []opCommand, args []string) error {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: relay %s <command> [arguments] [flags]\n\n%s\n\nCommands:\n", group, summary)
		tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, c := range cmds {
			fmt.Fprintf(tw, "  %s\t%s\n", strings.Join(append([]string{c.name}, c.args...), " "), c.summary)
		}
		tw.Flush() //nolint:errcheck // a terminal
		fmt.Fprintf(w, "\nEvery command takes --url (default $%s, else %s), --token (default $%s)\n"+
			"and --output table|json; relay %s <command> --help lists its flags.\n", apiURLEnv, defaultAPIURL, apiTokenEnv, group)
	}
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "relay %s: name a command\n\n", group)
		usage(os.Stderr)
		return usageError{errors.New("name a command")}
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		usage(os.Stdout)
		return errHelp
	}
	for _, c := range cmds {
		if c.name == args[0] {
			return runOp(ctx, group+" "+c.name, c, args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "relay %s: unknown command %q\n\n", group, args[0])
	usage(os.Stderr)
	return usageError{fmt.Errorf("unknown command %q", args[0])}
}

// runOp runs one command, named name (as the usage shows it: "jobs
// show"), on its command line.
func runOp(ctx context.Context, name string, c opCommand, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if c.flags != nil {
		c.flags(fs)
	}
	api := addAPIFlags(fs)
	pos, err := parseArgs(fs, args, c.args)
	if err != nil {
		return err
	}
	client, err := api.client()
	if err != nil {
		return err
	}
	return c.run(ctx, &opCall{api: client, out: api.output, args: pos, w: os.Stdout})
}

// get calls GET path and prints the answer: as sent with --output json,
// else through table, given the answer decoded into v.
func (c *opCall) get(ctx context.Context, path string, q url.Values, v any, table func()) error {
	b, err := c.api.call(ctx, "GET", path, q, nil, v)
	return c.show(b, err, table)
}

// post calls POST path with body and prints the answer like get.
func (c *opCall) post(ctx context.Context, path string, body, v any, table func()) error {
	b, err := c.api.call(ctx, "POST", path, nil, body, v)
	return c.show(b, err, table)
}

// delete calls DELETE path and prints the answer like get.
func (c *opCall) delete(ctx context.Context, path string, v any, table func()) error {
	b, err := c.api.call(ctx, "DELETE", path, nil, nil, v)
	return c.show(b, err, table)
}

// show prints an answer b (the call's error, if any, returned instead):
// b itself with --output json, else table's rendering of it.
func (c *opCall) show(b []byte, err error, table func()) error {
	if err != nil {
		return err
	}
	if c.out != "json" {
		table()
		return nil
	}
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		fmt.Fprintln(c.w)
	}
	return nil
}

// table writes rows in aligned columns, the first row being the header.
func (c *opCall) table(rows [][]string) {
	tw := tabwriter.NewWriter(c.w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush() //nolint:errcheck // stdout
}

// fields writes name: value lines, aligned.
func (c *opCall) fields(kv ...string) {
	tw := tabwriter.NewWriter(c.w, 0, 0, 1, ' ', 0)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", kv[i], kv[i+1])
		}
	}
	tw.Flush() //nolint:errcheck // stdout
}

// timeLayout is the one format of every time the commands print: the
// local zone (TZ) with its offset, to the second.
const timeLayout = "2006-01-02 15:04:05 -07:00"

// fmtTime formats t in the local zone; the zero time is "-".
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(timeLayout)
}

// fmtTimePtr is fmtTime of an optional time.
func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return fmtTime(*t)
}

// fmtMS formats a duration in milliseconds, rounded for reading.
func fmtMS(ms *int64) string {
	if ms == nil {
		return "-"
	}
	return fmtDuration(time.Duration(*ms) * time.Millisecond)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// cell makes s fit a table cell: one line, at most n runes.
func cell(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

// compactJSON is a JSON value on one line ("-" when absent).
func compactJSON(b json.RawMessage) string {
	if len(b) == 0 {
		return "-"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}

// nextPage tells a person how to ask for the next page of a list.
func (c *opCall) nextPage(cursor string) {
	if cursor != "" {
		fmt.Fprintf(c.w, "\nmore: add --cursor %s\n", cursor)
	}
}

// timeFlag is a flag holding an RFC 3339 time (zero when not given).
type timeFlag struct{ t time.Time }

func (f *timeFlag) String() string {
	if f == nil || f.t.IsZero() {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(s string) error {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time (2026-12-01T09:00:00Z), not %q", s)
	}
	f.t = t
	return nil
}

// setTime adds an RFC 3339 time to q when it is given.
func setTime(q url.Values, key string, f *timeFlag) {
	if !f.t.IsZero() {
		q.Set(key, f.t.Format(time.RFC3339Nano))
	}
}

// setString adds a value to q when it is not empty.
func setString(q url.Values, key, v string) {
	if v != "" {
		q.Set(key, v)
	}
}
