package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// lastActionCall is the call id of runID's last action intent.
func lastActionCall(t *testing.T, s seams.RunStore, runID string) string {
	t.Helper()
	stream, err := s.Load(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(stream) - 1; i >= 0; i-- {
		if in, ok := stream[i].Event.(events.Intent); ok && in.IntentKind == events.IntentAction {
			return in.ResultID
		}
	}
	t.Fatalf("run %s has no action", runID)
	return ""
}

// TestARunAwaitingAPersonIsShownWithItsCall: on a bbolt file and on a
// postgres:// store, runs --status awaiting_approval (and
// awaiting_resolution) lists the runs that wait for a person, with the
// call — in --json the whole pending call; verify, events and steps of
// such a run show the call (tool, arguments, id, since when) and the
// polyloop-admin commands that decide it; once decided, the run is
// listed so no more.
func TestARunAwaitingAPersonIsShownWithItsCall(t *testing.T) {
	for _, kind := range []string{"bbolt", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			var target string
			var open func() seams.RunStore
			if kind == "bbolt" {
				target = filepath.Join(t.TempDir(), "s.db")
				open = func() seams.RunStore {
					s, err := kv.Open(target, kv.Options{NoSync: true})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
			} else {
				url, s := pgURL(t)
				target, open = url, func() seams.RunStore { return struct{ seams.RunStore }{s} } // closed by pgURL's cleanup
			}
			s := open()
			writeDecisions(t, s)
			approval, resolution := lastActionCall(t, s, "k-awaiting-approval"), lastActionCall(t, s, "l-awaiting-resolution")
			if c, ok := s.(interface{ Close() error }); ok {
				c.Close()
			}
			store := stores.Describe(target)
			if kind == "postgres" {
				store = "'" + store + "'" // quoted for the shell: its ? and &
			}
			inspect := func(args ...string) string {
				t.Helper()
				var out, errOut strings.Builder
				if code := run(args, &out, &errOut); code != exitOK || errOut.Len() > 0 {
					t.Fatalf("%q: exit %d\n%s%s", args, code, out.String(), errOut.String())
				}
				return out.String()
			}
			listed := func(out string) []string {
				var runs []string
				for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
					runs = append(runs, regexp.MustCompile(`\s{2,}`).Split(line, -1)[0]+" "+line[strings.LastIndex(line, "  ")+2:])
				}
				return runs
			}
			if got := listed(inspect("runs", "--status", "awaiting_approval", target)); fmt.Sprint(got) != "[k-awaiting-approval refund call "+approval+"]" {
				t.Errorf("runs --status awaiting_approval: %q", got)
			}
			if got := listed(inspect("runs", "--status", "awaiting_resolution", target)); fmt.Sprint(got) != "[l-awaiting-resolution pay call "+resolution+"]" {
				t.Errorf("runs --status awaiting_resolution: %q", got)
			}
			var listing report.RunJSON
			if err := json.Unmarshal([]byte(inspect("runs", "--json", "--status", "awaiting_approval", target)), &listing); err != nil {
				t.Fatal(err)
			}
			if p := listing.Pending; listing.RunID != "k-awaiting-approval" || p == nil || p.Call != approval || p.Awaits != events.AwaitsApproval ||
				p.Tool == nil || *p.Tool != "refund" || p.Arguments == nil || *p.Arguments != `{"amount":250}` || p.ArgumentsSchema == nil || p.Since == nil {
				t.Errorf("runs --json: %+v, pending %+v", listing, listing.Pending)
			}
			block := "awaits approval since " + *listing.Pending.Since + ": step 0, tool refund, call " + approval + "\n" +
				"    arguments: {\"amount\":250}\n" +
				"    approve: polyloop-admin approve " + store + " k-awaiting-approval " + approval + " [--note TEXT] [--arguments JSON]\n" +
				"    reject:  polyloop-admin reject " + store + " k-awaiting-approval " + approval + " [--note TEXT]\n"
			for _, cmd := range []string{"verify", "events", "steps"} {
				if out := inspect(cmd, target, "k-awaiting-approval"); !strings.Contains(out, block) {
					t.Errorf("%s of the run awaiting approval:\n%s\nwant it to hold\n%s", cmd, out, block)
				}
			}
			verify := inspect("verify", target, "k-awaiting-approval")
			if !strings.HasPrefix(verify, "k-awaiting-approval: awaiting_approval in step 0: wait for a person's decision, write nothing\n"+
				"  nobody drives it; it waits for a person's decision (approve or reject the pending call)\n") {
				t.Errorf("verify:\n%s", verify)
			}
			resolve := "    it did not run: polyloop-admin resolve " + store + " l-awaiting-resolution " + resolution + " --not-executed\n"
			if out := inspect("verify", target, "l-awaiting-resolution"); !strings.Contains(out, "awaits an operator's finding") || !strings.Contains(out, resolve) {
				t.Errorf("verify of the run awaiting a finding:\n%s", out)
			}

			s = open()
			if _, err := engine.Decide(context.Background(), s, events.Decision{RunID: "k-awaiting-approval", ResultID: approval,
				Verdict: events.VerdictApproved, By: "ana"}); err != nil {
				t.Fatal(err)
			}
			if c, ok := s.(interface{ Close() error }); ok {
				c.Close()
			}
			if got := listed(inspect("runs", "--status", "awaiting_approval", target)); len(got) != 0 {
				t.Errorf("runs awaiting approval once it was approved: %q", got)
			}
			if out := inspect("verify", target, "k-awaiting-approval"); strings.Contains(out, "polyloop-admin") ||
				!strings.Contains(out, "k-awaiting-approval: interrupted, resumable in step 0 at approved: write the approved action's intent, then execute it") {
				t.Errorf("verify once approved:\n%s", out)
			}
		})
	}
}

// TestAnActionInDoubtNamesTheCommandThatSettlesIt: verify of a run whose
// action a crash left in doubt, that nobody drives, names the resolve
// commands, either finding; of a model call in doubt, which no operator
// settles, nothing.
func TestAnActionInDoubtNamesTheCommandThatSettlesIt(t *testing.T) {
	mem := &seamstest.MemStore{}
	sound := proptest.SoundStream("action")
	proptest.AppendEach(t, mem, "action", sound[:4]) // the action's intent, no outcome
	proptest.AppendEach(t, mem, "model", proptest.SoundStream("model")[:2])
	for run, want := range map[string]string{
		"action": "  an operator who knows whether it ran may settle it:\n" +
			"    it ran:         polyloop-admin resolve " + stores.Describe("STORE") + " action r0a --executed --observation TEXT\n" +
			"    it did not run: polyloop-admin resolve " + stores.Describe("STORE") + " action r0a --not-executed\n",
		"model": "",
	} {
		var out, errOut strings.Builder
		c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", run}}
		if code := c.verifyIn(mem); code != exitOK || !strings.Contains(out.String(), want) || want == "" && strings.Contains(out.String(), "resolve") {
			t.Errorf("verify %s: exit %d\n%s%s\nwant it to hold %q", run, code, out.String(), errOut.String(), want)
		}
	}
}

// TestFollowSaysARunWaitsForAPerson: events --follow of a run whose last
// event is an action awaiting approval says the run waits for a person's
// decision, not that its driver stopped.
func TestFollowSaysARunWaitsForAPerson(t *testing.T) {
	old := followPoll
	followPoll = time.Millisecond
	defer func() { followPoll = old }()
	mem := &seamstest.MemStore{}
	sound := proptest.SoundStream("r")
	in := sound[3].(events.Intent)
	in.ToolName, in.Awaits, in.Arguments = "refund", events.AwaitsApproval, `{"amount":250}`
	proptest.AppendEach(t, mem, "r", append(sound[:3:3], in))
	var out, errOut syncBuffer
	c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", "r"}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- c.followIn(ctx, mem, "r", func(env events.Envelope) { fmt.Fprintln(&out, env.Kind) })
	}()
	waitFor(t, &errOut, "\n")
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d", code)
	}
	want := "polyloop-inspect: run \"r\" is awaiting_approval: nobody drives it; it waits for a person's decision (approve or reject the pending call); still following\n"
	if errOut.String() != want {
		t.Fatalf("stderr %q, want %q", errOut.String(), want)
	}
}

// TestFollowSaysWhatARunNobodyDrivesIs: events --follow of a run nobody
// drives says its status as the listing does, from the events printed:
// in_doubt when its tail leaves a side effect's outcome unknown (an
// action's or a model call's), awaiting_resolution when an action in
// doubt waits for an operator's finding, interrupted between steps.
func TestFollowSaysWhatARunNobodyDrivesIs(t *testing.T) {
	old := followPoll
	followPoll = time.Millisecond
	defer func() { followPoll = old }()
	sound := proptest.SoundStream("r")
	resolution := sound[3].(events.Intent)
	resolution.Awaits = events.AwaitsResolution
	for _, c := range []struct {
		name   string
		stream []events.Event
		says   string
	}{
		{"an action in doubt", sound[:4], `run "r" is in_doubt: nobody drives it (its driver stopped); still following`},
		{"a model call in doubt", sound[:2], `run "r" is in_doubt: nobody drives it (its driver stopped); still following`},
		{"an action awaiting a finding", append(sound[:4:4], resolution),
			`run "r" is awaiting_resolution: nobody drives it; it waits for an operator's finding on the action in doubt (executed or not); still following`},
		{"between steps", sound[:5], `run "r" is interrupted: nobody drives it (its driver stopped); still following`},
	} {
		mem := &seamstest.MemStore{}
		proptest.AppendEach(t, mem, "r", c.stream)
		var out, errOut syncBuffer
		cl := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", "r"}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- cl.followIn(ctx, mem, "r", func(env events.Envelope) { fmt.Fprintln(&out, env.Kind) })
		}()
		waitFor(t, &errOut, "\n")
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("%s: exit %d", c.name, code)
		}
		if want := "polyloop-inspect: " + c.says + "\n"; errOut.String() != want {
			t.Errorf("%s: stderr %q, want %q", c.name, errOut.String(), want)
		}
	}
}
