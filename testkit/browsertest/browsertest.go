// Package browsertest starts a headless Chromium for end-to-end tests of
// the dashboard (github.com/chromedp/chromedp). Tests skip, with a message,
// when no Chromium is installed (fail under CI=true); .ci/run installs
// Debian's chromium.
package browsertest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium finds a Chromium: $RELAY_CHROMIUM, else chromium (Debian),
// chromium-browser, google-chrome or google-chrome-stable on PATH. It skips
// the test when there is none, and fails it under CI=true (a CI run must
// not pass without its browser tests).
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("RELAY_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const why = "no Chromium found (set $RELAY_CHROMIUM, or install Debian's chromium package as .ci/run does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(why + ": under CI=true a browser test must run, not skip")
	}
	t.Skip(why + ": skipping this browser test")
	return ""
}

// New starts a headless Chromium with a fresh profile, offline-minded flags
// and a 1280×800 window, stopped when the test ends. Each Tab of it has its
// own session storage.
func New(t testing.TB) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	if err := chromedp.Do(bctx); err != nil { // start the browser (no timeout on this first call)
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// Tab opens a new tab of the browser.
func Tab(t testing.TB, browser context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // open the tab (no timeout on this first call)
		t.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// Timeout bounds each step of Run and Value: generous, because CI is
// loaded; the steps wait for elements, never for fixed times.
const Timeout = 60 * time.Second

// Run runs steps in the tab, failing the test (with the page's main
// element when a wait timed out).
func Run(t testing.TB, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(tab, Timeout)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			hc, hcancel := context.WithTimeout(tab, 5*time.Second)
			html, _ := chromedp.Run(hc, chromedp.OuterHTML(chromedp.CSS("main"))) //nolint:errcheck // best effort
			hcancel()
			t.Fatalf("%s: timed out; the page's main:\n%s", what, html)
		}
		t.Fatalf("%s: %v", what, err)
	}
}

// Value runs one action that reads a value.
func Value[T any](t testing.TB, tab context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(tab, Timeout)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// Screenshot saves a PNG of the viewport as dir/name.png.
func Screenshot(dir, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		buf, err := chromedp.CaptureScreenshot()(ctx, t)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644)
	})
}
