package viewer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	t.Cleanup(srv.Close) // after the browser's cleanup: an open page holds a follow stream
	model := seamstest.NewPausingModel(&seamstest.Model{Turns: seamstest.Replies(`TOOL read {}`, `TOOL read {}`, `FINAL: done`)}, 2)
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(context.Background(), engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: "live", Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}})
		done <- err
	}()
	<-model.Entered // step 0 is durable; the run waits in its second model call

	bctx := newBrowser(t, path)

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
	// The page may reload once more (the run's last events): read the
	// status it settles on.
	status := waitText(t, bctx, "#status", "finished")
	t.Log(fmt.Sprintf("the page shows %d steps, status %s", steps(), status))
}

// newBrowser starts a headless Chromium at path; the first action starts
// it, and its life is the returned context's.
func newBrowser(t *testing.T, path string) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// No timeout on the browser's context (chromedp's rule); a watchdog
	// ends a stuck test.
	watchdog := time.AfterFunc(90*time.Second, cancel)
	t.Cleanup(func() { watchdog.Stop() })
	return bctx
}

// waitText waits until the page's element sel holds want (the page may be
// reloading meanwhile) and returns its text; it fails t after a while.
func waitText(t *testing.T, bctx context.Context, sel, want string) string {
	t.Helper()
	var got string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		text, err := chromedp.Run(bctx, chromedp.Evaluate[string](
			`(function(){var e=document.querySelector(`+strconv.Quote(sel)+`);return e?e.textContent:"";})()`))
		if err == nil {
			got = text
			if strings.Contains(got, want) {
				return got
			}
		}
		if time.Now().After(deadline) {
			html, _ := chromedp.Run(bctx, chromedp.OuterHTML("body"))
			t.Fatalf("%s says %q, never %q; the page:\n%s", sel, got, want, html)
		}
	}
}

// TestInABrowserAnInterruptedRunSaysSo: a real headless Chromium shows
// the page of a run a driver holds; when the driver lets go of it without
// writing anything more (a worker that stops, or dies and its lease runs
// out), the page says, without anyone reloading it, that nobody drives
// the run; when a driver resumes it, the page follows the run to its end.
func TestInABrowserAnInterruptedRunSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path := browser(t)
	store := &seamstest.MemStore{}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: 50 * time.Millisecond}))
	t.Cleanup(srv.Close) // after the browser's cleanup: an open page holds a follow stream
	req := engine.Request{RunID: "stops", Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
		Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
	// A run that stopped at a step boundary, unfinished.
	interrupt := make(chan struct{})
	close(interrupt)
	_, err := engine.Run(context.Background(), engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(`TOOL read {}`)},
		Parser: seamstest.Parser{}, Store: store, Interrupt: interrupt}, req)
	if !errors.Is(err, engine.ErrInterrupted) {
		t.Fatalf("the first driver: %v, want it interrupted", err)
	}
	release, err := store.LockRun("stops") // a driver holds it, in a call
	if err != nil {
		t.Fatal(err)
	}

	bctx := newBrowser(t, path)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/run?id=stops"), chromedp.WaitVisible("#steps")); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	waitText(t, bctx, "#status", "running")
	waitText(t, bctx, "#liveness", "memstore drives it")
	release() // the driver lets go, writing nothing
	said := waitText(t, bctx, "#liveness", "interrupted: nobody drives it")
	waitText(t, bctx, "#status", "interrupted")

	_, err = engine.Resume(context.Background(), engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(`FINAL: done`)},
		Parser: seamstest.Parser{}, Store: store}, req)
	if err != nil {
		t.Fatal(err)
	}
	waitText(t, bctx, "#status", "finished")
	t.Logf("the page said %q, then followed the resumed run to its end", said)
}

// TestInABrowserAPersonApprovesACall: a real headless Chromium opens the
// page of a run whose refund awaits approval, from a viewer mounted as a
// writer: the pending call is at the top; a person types a note and
// clicks approve, and the page shows the decision and the call no longer
// pending. When a worker resumes the run, the page follows it to its end,
// the refund executed. Meanwhile a decision made elsewhere (engine.Decide)
// on another run appears on that run's open page without anyone reloading
// it.
func TestInABrowserAPersonApprovesACall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path := browser(t)
	store := &seamstest.MemStore{}
	call := awaitApproval(t, store, "refund", `{"amount":40}`)
	o := writerOptions(store)
	o.Poll = 50 * time.Millisecond
	srv := httptest.NewServer(viewer.New(store, o))
	t.Cleanup(srv.Close) // after the browser's cleanup: an open page holds a follow stream

	bctx := newBrowser(t, path)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/run?id=refund"), chromedp.WaitVisible(chromedp.CSS("#pending"))); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	waitText(t, bctx, "#pending-tool", "refund")
	waitText(t, bctx, "#pending-call", call.Call)
	if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS("#approve input[name=note]"), "within policy"),
		chromedp.Click(chromedp.CSS("#approve button"))); err != nil {
		t.Fatalf("approve: %v", err)
	}
	row := waitText(t, bctx, "#steps", "decision: approved by ana")
	if !strings.Contains(row, "note: within policy") {
		t.Errorf("the decision's row says %q", row)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#pending, #decide form").length`)); err != nil || n != 0 {
		t.Errorf("after the approval the page shows %d pending calls and forms (%v)", n, err)
	}

	if _, err := engine.Resume(context.Background(), definition(store, `FINAL: refunded`), request("refund")); err != nil {
		t.Fatal(err)
	}
	waitText(t, bctx, "#status", "finished")
	waitText(t, bctx, "#steps", "refunded 40")

	other := awaitApproval(t, store, "other", `{"amount":60}`)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/run?id=other"), chromedp.WaitVisible(chromedp.CSS("#pending"))); err != nil {
		t.Fatalf("open the other page: %v", err)
	}
	if _, err := engine.Decide(context.Background(), store, events.Decision{RunID: "other", ResultID: other.Call,
		Verdict: events.VerdictRejected, By: "bo", Note: "over the limit"}); err != nil {
		t.Fatal(err)
	}
	said := waitText(t, bctx, "#steps", "decision: rejected by bo")
	t.Logf("the page of a run decided elsewhere shows: %q", strings.Join(strings.Fields(said), " "))
}
