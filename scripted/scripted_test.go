package scripted_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// TestTheScriptDecidesEachCall: the rules of a scripted call, one row each.
func TestTheScriptDecidesEachCall(t *testing.T) {
	failure := errors.New("endpoint down")
	turns := append(scripted.Replies("first", "second"), scripted.Turn{Err: failure}, scripted.Turn{Block: true})
	const never, before = -1, 0 // when the call's context is cancelled
	cases := []struct {
		name    string
		index   int
		cancel  time.Duration
		content string
		err     string
	}{
		{"call i gets turn i", 1, never, "second", ""},
		{"a replayed call gets the same reply", 0, never, "first", ""},
		{"a scripted error is the call's error", 2, never, "", "endpoint down"},
		{"a blocking turn waits for the context", 3, time.Millisecond, "", context.Canceled.Error()},
		{"a call whose context ended fails", 0, before, "", context.Canceled.Error()},
		{"a call past the script fails, naming it", 4, never, "", "scripted: no turn for call 4 (the script has 4)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &scripted.Model{Turns: turns}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch {
			case c.cancel == before:
				cancel()
			case c.cancel > 0:
				time.AfterFunc(c.cancel, cancel)
			}
			reply, err := m.Call(ctx, seams.ModelCall{CallIndex: c.index})
			if got := fmt.Sprint(err); c.err != "" && got != c.err || c.err == "" && err != nil {
				t.Fatalf("error %v, want %q", err, c.err)
			}
			if reply.Content != c.content {
				t.Fatalf("reply %q, want %q", reply.Content, c.content)
			}
		})
	}
}

// TestTheModelRecordsItsCalls: every call is recorded in order, OnCall sees
// each first, and the replies carry the call ids Replies gives them.
func TestTheModelRecordsItsCalls(t *testing.T) {
	var seen []int
	m := &scripted.Model{Turns: scripted.Replies("a", "b"), OnCall: func(c seams.ModelCall) { seen = append(seen, c.CallIndex) }}
	var ids []string
	for _, i := range []int{0, 1, 0} {
		r, err := m.Call(context.Background(), seams.ModelCall{CallIndex: i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.CallID)
	}
	var calls []int
	for _, c := range m.Calls() {
		calls = append(calls, c.CallIndex)
	}
	if fmt.Sprint(seen) != "[0 1 0]" || fmt.Sprint(calls) != "[0 1 0]" || strings.Join(ids, " ") != "call-0 call-1 call-0" {
		t.Fatalf("OnCall saw %v, Calls %v, call ids %v", seen, calls, ids)
	}
	if got := m.Parameters()["kind"]; got != "scripted" {
		t.Fatalf("Parameters kind %q", got)
	}
}
