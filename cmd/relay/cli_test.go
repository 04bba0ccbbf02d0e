package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// runRelay runs the binary and returns stdout, stderr and the exit code.
func runRelay(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("relay %v: %v", args, err)
	return "", "", 0
}

// Help exits 0 with usage on stdout; a usage error is printed once and
// exits 2; a failure exits 1 naming the command that failed.
func TestCommandLine(t *testing.T) {
	bin := buildRelay(t)
	for _, args := range [][]string{
		{"--help"}, {"help"}, {"migrate", "--help"}, {"demo", "-h"}, {"bench", "--help"},
		{"prove", "queue", "--help"}, {"prove", "scheduler", "--help"}, {"prove", "idempotency", "--help"}, {"prove", "outbox", "--help"},
	} {
		out, errOut, code := runRelay(t, bin, args...)
		if code != 0 || !strings.Contains(out, "Usage") || errOut != "" {
			t.Errorf("relay %s: exit %d, stdout %q, stderr %q; want usage on stdout, exit 0", strings.Join(args, " "), code, out, errOut)
		}
	}
	out, _, code := runRelay(t, bin, "prove", "--help")
	for _, proof := range []string{"queue", "scheduler", "idempotency", "outbox"} {
		if code != 0 || !strings.Contains(out, "\n  "+proof+" ") {
			t.Errorf("relay prove --help (exit %d) does not list the %s proof:\n%s", code, proof, out)
		}
	}
	for _, args := range [][]string{{"demo", "--nope"}, {"prove"}, {"prove", "bogus"}, {"bogus"}, {"migrate", "stray"}, {"bench", "--jobs", "many"}} {
		out, errOut, code := runRelay(t, bin, args...)
		if code != 2 || out != "" {
			t.Errorf("relay %s: exit %d, stdout %q; want exit 2, nothing on stdout", strings.Join(args, " "), code, out)
		}
		if first := strings.SplitN(errOut, "\n", 2)[0]; strings.Count(errOut, first) != 1 || !strings.HasPrefix(first, "relay") {
			t.Errorf("relay %s: the error is not printed exactly once:\n%s", strings.Join(args, " "), errOut)
		}
	}
	if _, errOut, code := runRelay(t, bin, "migrate"); code != 1 || !strings.HasPrefix(errOut, "relay migrate: no database") {
		t.Errorf("relay migrate without a database: exit %d, %q; want exit 1 and a message naming the command", code, errOut)
	}
	if _, errOut, code := runRelay(t, bin, "demo", "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=2"); code != 1 || !strings.HasPrefix(errOut, "relay demo: ") || strings.Contains(errOut, "demo: demo:") {
		t.Errorf("relay demo against a dead server: exit %d, %q; want exit 1 and one \"relay demo:\" prefix", code, errOut)
	}
	testFailFast(t, bin)
}

// testFailFast: the help is current, and a command that cannot use its
// database says why in one line: another database's URL (named by its
// scheme, never echoed), an unreachable server (its address), conflicting
// authentication.
func testFailFast(t *testing.T, bin string) {
	t.Helper()
	out, _, _ := runRelay(t, bin, "--help")
	if strings.Contains(out, "in progress") || !strings.Contains(out, "relay prove workflow") {
		t.Errorf("relay --help says workflows are in progress or omits prove workflow:\n%s", out)
	}
	oneLine := func(what, errOut string, want ...string) {
		t.Helper()
		if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%s: more than one line:\n%s", what, errOut)
		}
		for _, w := range want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%s: %q does not say %q", what, errOut, w)
			}
		}
	}
	// Every command that takes --database-url refuses it alike (the
	// proofs and the bench once panicked on any URL they could not open).
	for _, args := range [][]string{{"migrate"}, {"serve", "--no-auth"}, {"prove", "queue"}, {"prove", "workflow"},
		{"prove", "scheduler"}, {"prove", "idempotency"}, {"prove", "outbox"}, {"bench"}, {"bench", "--workflow"}} {
		cmd := strings.Join(args[:1+min(1, len(args)-1)], " ")
		if args[0] != "prove" {
			cmd = args[0]
		}
		_, errOut, code := runRelay(t, bin, append(args, "--database-url", "mysql://app:hunter2@db.example:3306/shop")...)
		if code != 1 || strings.Contains(errOut, "hunter2") || strings.Contains(errOut, "keyword/value") {
			t.Errorf("relay %s with a mysql:// URL: exit %d, %q", strings.Join(args, " "), code, errOut)
		}
		oneLine("relay "+strings.Join(args, " ")+" with a mysql:// URL", errOut, "relay "+cmd+": ", `"mysql"`, "PostgreSQL")
		_, errOut, code = runRelay(t, bin, append(args, "--database-url", "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")...)
		if code != 1 {
			t.Errorf("relay %s against a closed port: exit %d", strings.Join(args, " "), code)
		}
		oneLine("relay "+strings.Join(args, " ")+" against a closed port", errOut, "relay "+cmd+": cannot reach the database: ", "127.0.0.1:1")
	}
	cmd := exec.Command(bin, "serve", "--database-url", "postgres://unused", "--jwks-file", "keys.json")
	cmd.Env = append(os.Environ(), "RELAY_JWT_SECRET=s3cret")
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "RELAY_JWT_SECRET") || !strings.Contains(string(b), "--jwks-file") {
		t.Errorf("relay serve with both RELAY_JWT_SECRET and --jwks-file: %v, %q; want a refusal naming both", err, b)
	}
}

// commandRef finds a relay invocation in a shell line: `relay X`,
// `./cmd/relay X`, `bin/relay X`, `$ relay X`.
var commandRef = regexp.MustCompile(`(?:^|[\s/$(])relay\s+([a-z][a-z-]*)(.*)`)

// flagLine is a flag in flag.PrintDefaults output.
var flagLine = regexp.MustCompile(`(?m)^\s+-([\w-]+)`)

// Every `relay` subcommand and flag named in a README or docs code block
// exists. The list of commands and flags comes from the binary itself
// (`relay <command> --help`), so commands added later are checked as they
// are.
func TestDocsNameRealCommands(t *testing.T) {
	bin := buildRelay(t)
	root := filepath.Join("..", "..")
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	examples, _ := filepath.Glob(filepath.Join(root, "examples", "*", "*.md"))
	files = append(files, examples...)

	type command struct {
		flags map[string]bool
		group bool // its usage is "relay X <command>": the next word names one
	}
	commands := map[string]*command{} // "prove queue" → its flags; nil: no such command
	lookup := func(cmd []string) *command {
		key := strings.Join(cmd, " ")
		if c, ok := commands[key]; ok {
			return c
		}
		out, _, code := runRelay(t, bin, append(cmd, "--help")...)
		var c *command
		usage := "Usage: relay " + key + " "
		// The help must be this command's own: `relay jobs show 42 --help`
		// prints "Usage: relay jobs show ID", which does not make 42 a
		// command.
		if code == 0 && strings.Contains(out, usage) {
			c = &command{flags: map[string]bool{"h": true, "help": true}, group: strings.Contains(out, usage+"<")}
			for _, m := range flagLine.FindAllStringSubmatch(out, -1) {
				c.flags[m[1]] = true
			}
		}
		commands[key] = c
		return c
	}
	checked := 0
	seen := map[string]bool{} // the commands named, "jobs show"
	scan := func(file, text string, errorf func(string, ...any)) {
		inBlock, skip := false, false
		for i, line := range strings.Split(text, "\n") {
			if fence, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
				if !inBlock {
					lang := strings.TrimSpace(fence)
					skip = lang == "go" || lang == "sql" || lang == "mermaid" || lang == "json" || lang == "yaml"
				}
				inBlock = !inBlock
				continue
			}
			if !inBlock || skip || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue // a shell comment: output shown, not a command run
			}
			m := commandRef.FindStringSubmatch(line)
			if m == nil || m[1] == "help" {
				continue
			}
			rest := m[2]
			for _, stop := range []string{"|", "&&", ";", " #", ")"} {
				rest, _, _ = strings.Cut(rest, stop)
			}
			words := strings.Fields(rest)
			// A group (relay prove, relay jobs) takes its command from the
			// next word: relay prove queue, relay jobs show.
			cmd := []string{m[1]}
			c := lookup(cmd)
			for c != nil && c.group && len(words) > 0 && !strings.HasPrefix(words[0], "-") {
				cmd, words = append(cmd, words[0]), words[1:]
				c = lookup(cmd)
			}
			where := filepath.Base(file) + ":" + strconv.Itoa(i+1)
			if c == nil {
				errorf("%s: `relay %s` is not a command (relay %s --help fails)", where, strings.Join(cmd, " "), strings.Join(cmd, " "))
				continue
			}
			for _, w := range words {
				if !strings.HasPrefix(w, "-") || w == "-" {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
				if !c.flags[name] {
					errorf("%s: `relay %s` has no flag %s", where, strings.Join(cmd, " "), w)
				}
			}
			seen[strings.Join(cmd, " ")] = true
			checked++
		}
	}
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		scan(file, string(text), t.Errorf)
	}
	if checked < 5 {
		t.Fatalf("only %d relay command lines found in the docs; the scan is broken", checked)
	}

	// Every command of the operator's groups is named in the docs, as
	// their --help lists them.
	for _, group := range []string{"jobs", "runs", "schedules", "queues"} {
		out, _, _ := runRelay(t, bin, group, "--help")
		_, list, _ := strings.Cut(out, "\nCommands:\n")
		list, _, _ = strings.Cut(list, "\n\n")
		for _, l := range strings.Split(list, "\n") {
			if f := strings.Fields(l); len(f) > 0 && !seen[group+" "+f[0]] {
				t.Errorf("no README or docs code block names `relay %s %s`", group, f[0])
			}
		}
	}

	// The scan itself catches a command that is not one and a flag a
	// command lacks, and takes a group's command and its arguments apart.
	var problems []string
	scan("selfcheck.md", "```sh\nrelay jobs nosuch\nrelay jobs list --nope 1\nrelay runs show order-1/email --output json\n"+
		"bin/relay prove queue --kill 3\nrelay queues pause demo --url http://127.0.0.1:8080\n# {\"version\":\"relay v0.1.0\"}\n```\n",
		func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) })
	if want := []string{"selfcheck.md:2: `relay jobs nosuch` is not a command (relay jobs nosuch --help fails)",
		"selfcheck.md:3: `relay jobs list` has no flag --nope"}; !slices.Equal(problems, want) {
		t.Errorf("the scan of a known text found %q, want %q", problems, want)
	}
}

// Help names $DATABASE_URL as the default and never prints its value,
// which may hold a password; neither does a usage error.
func TestHelpDoesNotPrintTheDatabaseURL(t *testing.T) {
	bin := buildRelay(t)
	for _, args := range [][]string{{"demo", "--help"}, {"migrate", "-h"}, {"bench", "--help"}, {"prove", "queue", "--help"}, {"demo", "--nope"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://app:hunter2@db.internal/prod")
		out, _ := cmd.CombinedOutput()
		if strings.Contains(string(out), "hunter2") || !strings.Contains(string(out), "$DATABASE_URL") {
			t.Errorf("relay %s:\n%s\nwant $DATABASE_URL named, its value not printed", strings.Join(args, " "), out)
		}
	}
}

// `relay help <command>` is the command's help, not the general one.
func TestHelpCommand(t *testing.T) {
	bin := buildRelay(t)
	for _, args := range [][]string{{"help", "demo"}, {"help", "prove", "queue"}} {
		out, _, code := runRelay(t, bin, args...)
		want := "Usage: relay " + strings.Join(args[1:], " ") + " [flags]"
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("relay %s: exit %d\n%s\nwant %q", strings.Join(args, " "), code, out, want)
		}
	}
	if _, _, code := runRelay(t, bin, "help", "nosuch"); code != 2 {
		t.Errorf("relay help nosuch: exit %d, want 2", code)
	}
}
