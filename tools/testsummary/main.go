// Command testsummary reads `go test -json` on stdin and prints what a
// person needs from a whole-repository run: a line per package (as go test
// prints it), the full output of every failed test only, and at the end
// every skipped test with its reason. It exits 1 when any test or package
// failed (or the input ended inside a package that never reported), else 0.
//
//	go test -json ./... | go run ./tools/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	ImportPath  string // build-output events
	Test        string
	Output      string
	Elapsed     float64
	FailedBuild string
}

type testKey struct{ pkg, test string }

func main() {
	os.Exit(summarize(os.Stdin, os.Stdout))
}

// summarize does the work of main on in and out, returning the exit code.
func summarize(in io.Reader, out io.Writer) int {
	output := map[testKey][]string{} // buffered until the test ends
	open := map[string]bool{}        // packages started, not yet ended
	var skipped []string
	failed := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintf(out, "%s\n", line) // not an event (go's own message): pass it on
			continue
		}
		k := testKey{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			failed = true
		case "start":
			open[e.Package] = true
		case "output":
			output[k] = append(output[k], e.Output)
		case "pass":
			delete(output, k)
			if e.Test == "" {
				delete(open, e.Package)
				fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
		case "skip":
			if e.Test == "" {
				delete(open, e.Package)
				if !noTests(output[k]) {
					fmt.Fprintf(out, "ok  \t%s\t%.3fs (all skipped)\n", e.Package, e.Elapsed)
				} else {
					fmt.Fprintf(out, "?   \t%s\t[no test files]\n", e.Package)
				}
			} else {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, skipReason(output[k])))
			}
			delete(output, k)
		case "fail":
			failed = true
			if e.Test != "" {
				fmt.Fprint(out, strings.Join(output[k], ""))
				delete(output, k)
				continue
			}
			// The package failed: print what is left of it (tests that
			// never ended, as under a timeout or a panic, and its own
			// output), then its line.
			delete(open, e.Package)
			printLeft(out, output, e.Package)
			fmt.Fprintf(out, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsummary: read: %v\n", err)
		failed = true
	}
	for pkg := range open {
		printLeft(out, output, pkg)
		fmt.Fprintf(out, "FAIL\t%s\t(the test binary ended without a result)\n", pkg)
		failed = true
	}
	sort.Strings(skipped)
	if len(skipped) > 0 {
		fmt.Fprintf(out, "\n%d tests skipped:\n", len(skipped))
		for _, s := range skipped {
			fmt.Fprintf(out, "  %s\n", s)
		}
	} else {
		fmt.Fprintln(out, "\nno test skipped")
	}
	if failed {
		fmt.Fprintln(out, "FAIL")
		return 1
	}
	return 0
}

// printLeft prints the buffered output of package pkg: its tests' in name
// order, then its own.
func printLeft(out io.Writer, output map[testKey][]string, pkg string) {
	var keys []testKey
	for k := range output {
		if k.pkg == pkg {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].test < keys[j].test })
	for _, k := range keys {
		if k.test == "" {
			continue
		}
		fmt.Fprint(out, strings.Join(output[k], ""))
		delete(output, k)
	}
	for _, l := range output[testKey{pkg, ""}] {
		// go test's own result lines: summarize prints its own.
		if l == "FAIL\n" || l == "PASS\n" || strings.HasPrefix(l, "FAIL\t"+pkg) || strings.HasPrefix(l, "ok  \t"+pkg) {
			continue
		}
		fmt.Fprint(out, l)
	}
	delete(output, testKey{pkg, ""})
}

// noTests says whether a skipped package's output is go test's "no test
// files".
func noTests(lines []string) bool {
	for _, l := range lines {
		if strings.Contains(l, "[no test files]") {
			return true
		}
	}
	return len(lines) == 0
}

// skipReason is the message a skipped test logged: its lines other than
// the run/skip markers, joined.
func skipReason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}
