package main

import (
	"strings"
	"testing"
)

// A run with a passing, a skipped and a failing test: the failure's output
// is printed, the passing test's is not, the skip is listed with its
// reason, and the exit code is 1.
func TestSummarize(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"output","Package":"p","Test":"TestOK","Output":"noise of a passing test\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestBrowser","Output":"=== RUN   TestBrowser\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBrowser","Output":"    b_test.go:9: no Chromium found\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBrowser","Output":"--- SKIP: TestBrowser (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestBrowser"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"    bad_test.go:3: the one failure\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestBad"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t1.5s\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":1.5}`,
		`{"Action":"start","Package":"q"}`,
		`{"Action":"pass","Package":"q","Elapsed":0.5}`,
	}, "\n")
	var out strings.Builder
	code := summarize(strings.NewReader(in), &out)
	s := out.String()
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{"the one failure", "FAIL\tp\t1.500s", "ok  \tq\t0.500s", "1 tests skipped:", "p TestBrowser: b_test.go:9: no Chromium found"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, "FAIL\tp\t") != 1 {
		t.Errorf("the package's result is not printed once:\n%s", s)
	}
	if strings.Contains(s, "noise of a passing test") {
		t.Errorf("a passing test's output was printed:\n%s", s)
	}
}

// A package whose binary ended without a result (killed) fails the run,
// with what its unfinished tests printed.
func TestSummarizeUnfinishedPackage(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"still running\n"}`
	var out strings.Builder
	if code := summarize(strings.NewReader(in), &out); code != 1 || !strings.Contains(out.String(), "still running") {
		t.Errorf("exit %d:\n%s", code, out.String())
	}
}
