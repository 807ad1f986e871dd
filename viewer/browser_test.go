package viewer_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// BrowserRequiredEnv, when set and not "0", makes a missing browser a
// failure instead of a skip (CI sets it).
const BrowserRequiredEnv = "POLYLOOP_BROWSER_REQUIRED"

func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if v := os.Getenv(BrowserRequiredEnv); v != "" && v != "0" {
		t.Fatalf("%s is set but no Chromium is installed", BrowserRequiredEnv)
	}
	t.Skip("no Chromium (apt-get install chromium) for the end-to-end viewer test")
	return ""
}

// TestInABrowserANewStepAppears: a real headless Chromium opens a running
// run's page; when the agent completes another step, the page shows it
// without anyone reloading it.
func TestInABrowserANewStepAppears(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path := browser(t)
	store := &seamstest.MemStore{}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: 50 * time.Millisecond}))
	defer srv.Close()
	model := seamstest.NewPausingModel(&seamstest.Model{Turns: seamstest.Replies(`TOOL read {}`, `TOOL read {}`, `FINAL: done`)}, 2)
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(context.Background(), engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: "live", Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}})
		done <- err
	}()
	<-model.Entered // step 0 is durable; the run waits in its second model call

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first action starts the browser, whose life is that context's:
	// no timeout on it (chromedp's rule); a watchdog ends a stuck test.
	watchdog := time.AfterFunc(90*time.Second, cancel)
	defer watchdog.Stop()

	steps := func() int {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#steps tr.step").length`))
		if err != nil {
			t.Fatalf("browser: %v", err)
		}
		return n
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/run?id=live"), chromedp.WaitVisible("#steps")); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	if n := steps(); n != 1 {
		t.Fatalf("the page shows %d steps before the agent goes on, want 1", n)
	}
	close(model.Release) // the agent completes step 1 (and finishes)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for steps() < 2 {
		if time.Now().After(deadline) {
			html, _ := chromedp.Run(bctx, chromedp.OuterHTML("body"))
			t.Fatalf("no new step appeared; the page:\n%s", html)
		}
		time.Sleep(100 * time.Millisecond)
	}
	status, err := chromedp.Run(bctx, chromedp.Text("#status"))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(fmt.Sprintf("the page shows %d steps, status %s", steps(), status))
}
