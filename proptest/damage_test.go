package proptest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// The damage corpus. A store of finished and crashed runs is damaged in
// every way a disk or a careless copy damages files — a bit flipped at
// every 64th byte, truncations at and between page boundaries, each page
// zeroed, each meta page's fields damaged, copies taken while a writer was
// writing — and each damaged file is opened read-only and read-write in a
// child process (a panic or a hang there cannot take the test with it),
// which loads and checks every run and resumes the crashed ones. The oracle
// is the original streams, not recovery: a run that loads without error
// must load exactly as written (a torn copy: as a prefix of what was
// finally written), and a resume must leave what was there untouched.
// Required: no panic, no hang, no accepted alteration. make test runs a
// sample of each kind; make damage (and so make soak and CI) runs it all
// (-damage.all).

var damageAll = flag.Bool("damage.all", false, "run the whole damage corpus, not a sample of each kind")

const (
	damageChildEnv = "POLYLOOP_DAMAGE_CHILD" // path of the damaged file
	damageModeEnv  = "POLYLOOP_DAMAGE_MODE"  // ro or rw
	damageRunsEnv  = "POLYLOOP_DAMAGE_RUNS"  // run ids, comma-separated
)

// damageAgent is the agent every corpus run uses, so a child can resume
// them with the same parameter snapshot.
func damageAgent(store seams.RunStore, runID string) (engine.Definition, engine.Request) {
	model := &seamstest.Model{Turns: seamstest.Replies(
		`TOOL count {"dir":"a"}`, "let me think", `TOOL pay {"amount":3}`, "ACTION: tidy up ✓", `TOOL count {"dir":"b"}`, "FINAL: done")}
	return engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
		engine.Request{RunID: runID, Executor: &seamstest.Executor{}, Tools: registry, ModelReplayPolicy: events.ReplaySafe,
			Budget:              engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
			Context:             engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "goal")}},
			ObservationTemplate: "Observation: {observation}", OneEventPerTransaction: true}
}

// damageRuns writes the corpus runs to store: two finished, and crashed
// ones whose tails hold each kind of side effect in doubt.
func damageRuns(t *testing.T, store seams.RunStore) []string {
	var ids []string
	for i, crash := range []int{-1, -1, 2, 3, 5, 8, 11} {
		id := fmt.Sprintf("run-%d", i)
		def, req := damageAgent(&proptest.CrashingStore{Inner: store, After: crash}, id)
		if _, err := engine.Run(context.Background(), def, req); err != nil && !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("corpus run %s: %v", id, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// childReport is what a child found in one damaged file.
type childReport struct {
	OpenError string `json:"open_error,omitempty"`
	// Reopen says what went wrong opening a refused file again in the same
	// process: ErrLocked, or descriptors left open.
	Reopen string `json:"reopen,omitempty"`
	// AfterWrites says what went wrong when a file that was accepted
	// read-write was written to (new runs), closed and opened again: it
	// no longer opens, or a run that loaded before loads differently.
	AfterWrites string      `json:"after_writes,omitempty"`
	Runs        []runReport `json:"runs,omitempty"`
}

type runReport struct {
	RunID  string   `json:"run_id"`
	Events []string `json:"events"` // each loaded event as JSON
	Error  string   `json:"error,omitempty"`
	// Resumed: the stop reason of a resume (rw, crashed runs), or its
	// error; Rewrote is set when the resume changed what was loaded.
	Resumed string `json:"resumed,omitempty"`
	Rewrote bool   `json:"rewrote,omitempty"`
}

func eventJSON(envs []events.Envelope) []string {
	out := make([]string, len(envs))
	for i, env := range envs {
		b, _ := json.Marshal(env.Event)
		out[i] = fmt.Sprintf("%s %s %s", env.ID, env.Kind, b)
	}
	return out
}

// runDamageChild is the child: open, load, check, resume, report on stdout.
func runDamageChild() int {
	path, ro := os.Getenv(damageChildEnv), os.Getenv(damageModeEnv) == "ro"
	var rep childReport
	defer func() { json.NewEncoder(os.Stdout).Encode(rep) }()
	if f, err := os.Open(path); err == nil {
		f.Close() // the runtime's poller opens its descriptors on the first file; count after that
	}
	fds := openFDs()
	// Neither fsync nor the reader socket has a part in what a child
	// checks — how a damaged file reads and takes writes — and without
	// them the corpus's thousands of children do not wait on the disk.
	s, err := kv.Open(path, kv.Options{ReadOnly: ro, LockTimeout: time.Second, NoSync: true, NoServe: true})
	if err != nil {
		rep.OpenError = err.Error()
		// A refused open leaves nothing behind: opening again, either way,
		// gives the same refusal, not ErrLocked.
		for _, again := range []bool{!ro, ro} {
			s, err := kv.Open(path, kv.Options{ReadOnly: again, LockTimeout: 100 * time.Millisecond, NoSync: true, NoServe: true})
			switch {
			case err == nil:
				s.Close()
			case errors.Is(err, kv.ErrLocked):
				rep.Reopen = fmt.Sprintf("reopened read-only=%t: %v", again, err)
			}
		}
		if n := openFDs(); n != fds {
			rep.Reopen += fmt.Sprintf(" %d descriptors open before, %d after", fds, n)
		}
		return 0
	}
	ctx := context.Background()
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	ids := strings.Split(os.Getenv(damageRunsEnv), ",")
	for _, id := range ids {
		stream, err := s.Load(ctx, id)
		r := runReport{RunID: id, Events: eventJSON(stream)}
		v, err := recovery.ClassifyLoaded(id, stream, err)
		if err != nil {
			r.Error = err.Error()
		} else if !ro && v.State != recovery.Finished && v.State != recovery.Empty {
			def, req := damageAgent(s, id)
			res, err := engine.Resume(ctx, def, req)
			r.Resumed = string(res.StopReason)
			if err != nil {
				r.Resumed = "error: " + err.Error()
			}
			after, _ := s.Load(ctx, id)
			r.Rewrote = len(after) < len(stream) || !equalStrings(eventJSON(after[:len(stream)]), r.Events)
		}
		rep.Runs = append(rep.Runs, r)
	}
	if ro {
		return 0
	}
	// Write to the accepted file — new runs, which make bbolt allocate and
	// free pages — then open it again: damage the file check let through
	// would surface here as a file that no longer opens or a run changed.
	before := map[string][]string{}
	for _, id := range ids {
		if stream, err := s.Load(ctx, id); err == nil {
			before[id] = eventJSON(stream)
		}
	}
	for i := range 3 {
		id := fmt.Sprintf("probe-%d", i)
		def, req := damageAgent(s, id)
		if _, err := engine.Run(ctx, def, req); err != nil {
			rep.AfterWrites = fmt.Sprintf("a new run on the accepted file failed: %v", err)
			return 0
		}
	}
	s.Close()
	s, err = kv.Open(path, kv.Options{LockTimeout: time.Second, NoSync: true, NoServe: true})
	if err != nil {
		rep.AfterWrites = fmt.Sprintf("the file no longer opens after writes: %v", err)
		return 0
	}
	for id, want := range before {
		stream, err := s.Load(ctx, id)
		if err != nil || !equalStrings(eventJSON(stream), want) {
			rep.AfterWrites = fmt.Sprintf("run %s loaded before the writes, and after them: %d events (%v)", id, len(stream), err)
			return 0
		}
	}
	return 0
}

// openFDs counts this process's open descriptors (-1 where /proc is not).
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

func equalStrings(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") }

func TestDamageCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip("the damage corpus runs child processes")
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	s, err := kv.Open(good, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids := damageRuns(t, s)
	originals := map[string][]string{}
	for _, id := range ids {
		stream, err := s.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		originals[id] = eventJSON(stream)
	}
	s.Close()
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// A sample of each kind of damage, the first of each always: every
	// 128th (512th under the race detector, which makes each child
	// slower to start and to run), every 8th (32nd) under POLYLOOP_SOAK=1,
	// or all of them (make damage: make soak and CI).
	every := soak.Count(128, 8)
	if raceDetector {
		every *= 4
	}
	if *damageAll {
		every = 1
	}
	corpus, err := kvtest.DamageSample(whole, every)
	if err != nil {
		t.Fatal(err)
	}
	torn, tornOriginals := tornCopies(t, dir)
	corpus = append(corpus, kvtest.Sample(torn, every)...)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Each copy is opened in a child process of its own, as many at once
	// as there are processors: the children share nothing but the
	// executable.
	type open struct {
		d    kvtest.Damaged
		path string
		mode string
	}
	var tried, noEffect, refused int
	var mu sync.Mutex
	opens := make(chan open)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for o := range opens {
				want, runs := originals, ids
				if o.d.Torn {
					want, runs = tornOriginals, tornRunIDs()
				}
				rep, err := runChild(exe, o.path, o.mode, runs)
				os.Remove(o.path)
				mu.Lock()
				switch verdict := judge(rep, want, o.d.Torn); {
				case err != nil:
					t.Errorf("%s (%s): %v", o.d.Name, o.mode, err)
				case strings.HasPrefix(verdict, "altered"):
					t.Errorf("%s (%s): %s", o.d.Name, o.mode, verdict)
				case verdict == "refused":
					refused++
				default:
					noEffect++
				}
				mu.Unlock()
			}
		})
	}
	for i, d := range corpus {
		for _, mode := range []string{"ro", "rw"} {
			path := filepath.Join(dir, fmt.Sprintf("d%05d-%s.db", i, mode))
			if err := os.WriteFile(path, d.Bytes, 0o600); err != nil {
				close(opens)
				wg.Wait()
				t.Fatal(err)
			}
			tried++
			opens <- open{d, path, mode}
		}
	}
	close(opens)
	wg.Wait()
	t.Logf("damage corpus: every %d of each kind: %d damaged files (of %d torn copies, %d), %d opens tried (read-only and read-write): %d no effect, %d refused",
		every, len(corpus), len(torn), len(kvtest.Sample(torn, every)), tried, noEffect, refused)
}

// runChild runs the test binary as a damage child on path.
func runChild(exe, path, mode string, runs []string) (childReport, error) {
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), damageChildEnv+"="+path, damageModeEnv+"="+mode, damageRunsEnv+"="+strings.Join(runs, ","),
		// A race-enabled child otherwise sleeps a second at exit.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return childReport{}, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return childReport{}, fmt.Errorf("child failed (%v): %s", err, tail(errOut.String()))
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		return childReport{}, errors.New("child hung for 30s")
	}
	var rep childReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return childReport{}, fmt.Errorf("child report: %v: %s", err, tail(out.String()))
	}
	return rep, nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}

// judge compares a child's report with the original streams: "no effect"
// (everything loaded as written), "refused" (the open or some run was
// refused, and nothing was accepted altered) or "altered: …".
func judge(rep childReport, want map[string][]string, torn bool) string {
	if rep.Reopen != "" {
		return "altered: a refused open left the file held: " + rep.Reopen
	}
	if rep.AfterWrites != "" {
		return "altered: " + rep.AfterWrites
	}
	if rep.OpenError != "" {
		return "refused"
	}
	verdict := "no effect"
	for _, r := range rep.Runs {
		orig := want[r.RunID]
		switch {
		case r.Error != "":
			verdict = "refused"
			continue
		case torn && len(r.Events) <= len(orig) && equalStrings(r.Events, orig[:len(r.Events)]):
			if len(r.Events) < len(orig) {
				verdict = "refused" // an older snapshot: not what was finally written, but nothing altered
			}
		case !equalStrings(r.Events, orig):
			return fmt.Sprintf("altered: run %s loaded without error as %d events that differ from the %d written:\n%s",
				r.RunID, len(r.Events), len(orig), diffLines(r.Events, orig))
		}
		if r.Rewrote {
			return fmt.Sprintf("altered: resuming run %s changed events it had loaded", r.RunID)
		}
		if strings.HasPrefix(r.Resumed, "error: ") && !strings.Contains(r.Resumed, "corrupt") {
			return fmt.Sprintf("altered: resuming run %s failed: %s", r.RunID, r.Resumed)
		}
	}
	return verdict
}

func diffLines(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("  first difference at event %d:\n  got  %s\n  want %s", i, g, w)
		}
	}
	return ""
}

func tornRunIDs() []string { return []string{"torn-0", "torn-1", "torn-2"} }

// tornCopies copies a store file 150 times while three runs write to it,
// and returns the copies and the runs' final streams.
func tornCopies(t *testing.T, dir string) ([]kvtest.Damaged, map[string][]string) {
	path := filepath.Join(dir, "torn.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, id := range tornRunIDs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			def, req := damageAgent(s, id)
			if _, err := engine.Run(context.Background(), def, req); err != nil {
				t.Errorf("torn run %s: %v", id, err)
			}
		}()
	}
	var copies []kvtest.Damaged
	stop := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		for i := 0; i < 150; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if b, err := os.ReadFile(path); err == nil {
				copies = append(copies, kvtest.Damaged{Name: fmt.Sprintf("copy %d taken during writes", i), Bytes: b, Torn: true})
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	wg.Wait()
	close(stop)
	<-copied
	originals := map[string][]string{}
	for _, id := range tornRunIDs() {
		stream, err := s.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		originals[id] = eventJSON(stream)
	}
	s.Close()
	return copies, originals
}
