package viewer_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// TestPagesShowWhoDrivesARun: a run a driver holds is running on the runs
// page and its own, with its holder, and its page shows no side effect in
// doubt and no plan for Resume whatever its tail (its driver is in the
// call); the same run once nobody holds it is in_doubt, its page saying
// nobody drives it, with the side effect in doubt and what Resume would
// do.
func TestPagesShowWhoDrivesARun(t *testing.T) {
	store, srv := fixture(t)
	release, err := store.LockRun("doubt") // a driver holds the run with a never action in its tail
	if err != nil {
		t.Fatal(err)
	}
	_, _, runs := get(t, srv.URL+"/")
	if !strings.Contains(runs, `<tr class="status-running">
  <td><a href="run?id=doubt">doubt</a></td>
  <td>running</td><td>-</td><td>memstore</td>`) {
		t.Errorf("runs page, the run held:\n%s", runs)
	}
	_, _, page := get(t, srv.URL+"/run?id=doubt")
	for _, want := range []string{`<b id="status">running</b>`, `holder <b id="holder">memstore</b>`,
		`<p id="liveness" class="liveness-running">memstore drives it</p>`, "running in step 1: its driver continues it", "&amp;live=running"} {
		if !strings.Contains(page, want) {
			t.Errorf("run page, the run held, lacks %q:\n%s", want, page)
		}
	}
	for _, never := range []string{"in-doubt", "Resume would:", "finish with resume_state_unknown"} {
		if strings.Contains(page, never) {
			t.Errorf("run page, the run held, shows %q:\n%s", never, page)
		}
	}
	var v report.VerdictJSON
	decode(t, srv.URL+"/api/verify?run=doubt", &v)
	if v.Verdict != "running" || v.Status != seams.StatusRunning || v.Plan != nil || v.InDoubt != nil || v.Owner == nil || *v.Owner != "memstore" {
		t.Errorf("verify, the run held: %+v", v)
	}

	release()
	_, _, runs = get(t, srv.URL+"/")
	if !strings.Contains(runs, `<td>in_doubt</td><td>-</td><td>-</td>`) {
		t.Errorf("runs page, nobody holding the run:\n%s", runs)
	}
	_, _, page = get(t, srv.URL+"/run?id=doubt")
	for _, want := range []string{`<b id="status">in_doubt</b>`, `<p id="liveness" class="liveness-interrupted"><b>interrupted</b>: nobody drives it (its driver stopped) — still following`,
		`id="in-doubt"`, "finish with resume_state_unknown", "&amp;live=interrupted"} {
		if !strings.Contains(page, want) {
			t.Errorf("run page, nobody holding the run, lacks %q:\n%s", want, page)
		}
	}
	decode(t, srv.URL+"/api/verify?run=doubt", &v)
	if v.Verdict != "resumable" || v.Status != seams.StatusInDoubt || v.Plan == nil || v.InDoubt == nil || v.Liveness == nil ||
		*v.Liveness != "nobody drives it (its driver stopped)" {
		t.Errorf("verify, nobody holding the run: %+v", v)
	}
}

// TestFollowSaysWhenADriverTakesTheRun: a client that shows the run
// interrupted (&live=) is told nothing while that holds, and a liveness
// event when a driver takes the run — then the driver's events. A live=
// that is no liveness is a bad request.
func TestFollowSaysWhenADriverTakesTheRun(t *testing.T) {
	store, _ := fixture(t)
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: time.Millisecond}))
	defer srv.Close()
	stream, err := store.Load(context.Background(), "doubt")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(srv.URL + "/api/follow?run=doubt&live=interrupted&after=" + strconv.Itoa(len(stream)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	frames := make(chan string, 16)
	go func() {
		lines := bufio.NewScanner(resp.Body)
		var frame []string
		for lines.Scan() {
			if lines.Text() == "" {
				frames <- strings.Join(frame, "\n")
				frame = nil
				continue
			}
			frame = append(frame, lines.Text())
		}
		close(frames)
	}()
	select {
	case f := <-frames:
		t.Fatalf("the client shows the run interrupted, and was sent %q", f)
	case <-time.After(1200 * time.Millisecond): // past a liveness check
	}
	release, err := store.LockRun("doubt")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var f string
	select {
	case f = <-frames:
	case <-time.After(10 * time.Second):
		t.Fatal("no liveness event after a driver took the run")
	}
	if liveness(t, f+"\n\n") != seams.StatusRunning || !strings.Contains(f, `"owner":"memstore"`) || !strings.Contains(f, `"liveness":"memstore drives it"`) {
		t.Fatalf("after a driver took the run: %q", f)
	}
	if code, _, body := get(t, srv.URL+"/api/follow?run=doubt&live=dead"); code != 400 || !strings.Contains(body, "running, awaiting or interrupted") {
		t.Errorf("live=dead: %d %s", code, body)
	}
}

// TestARunWhoseEntryIsDamagedIsShownCorrupt: the run page and the verdict
// of a run whose entry Describe finds damaged show the damage the stream
// shows, not a store failure.
func TestARunWhoseEntryIsDamagedIsShownCorrupt(t *testing.T) {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:5])
	srv := httptest.NewServer(viewer.New(seamstest.EntryDamaged{MemStore: mem}, viewer.Options{}))
	defer srv.Close()
	if code, _, body := get(t, srv.URL+"/run?id=r"); code != 200 || !strings.Contains(body, "corrupt: Resume would refuse") || !strings.Contains(body, "fails its checksum") {
		t.Errorf("run page: %d\n%s", code, body)
	}
	var v report.VerdictJSON
	decode(t, srv.URL+"/api/verify?run=r", &v)
	if v.Verdict != "corrupt" || len(v.Problems) == 0 {
		t.Errorf("verify: %+v", v)
	}
}
