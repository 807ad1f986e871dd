package progress_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// lockedBuffer is a buffer the run's goroutine writes and the model reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// model replies replies[i] to call i with usage of 10*(i+1) input and 1
// output tokens, and records how many lines the printer had written when
// each call was made.
type model struct {
	replies []string
	out     *lockedBuffer
	seen    []int
}

func (m *model) Call(_ context.Context, _ seams.ModelCall) (events.ModelReply, error) {
	i := len(m.seen)
	m.seen = append(m.seen, strings.Count(m.out.String(), "\n"))
	in, out := int64(10*(i+1)), int64(1)
	return events.ModelReply{Content: m.replies[i], Usage: &events.Usage{InputTokens: &in, OutputTokens: &out}}, nil
}

func (m *model) Parameters() map[string]string { return nil }

// TestALinePerStepAsItBecomesDurable: a run of an action, a reply the
// parser refuses, a control character in an action and a final answer
// prints one line per step — run, step, action, status, that step's
// tokens — each written before the next step's model call.
func TestALinePerStepAsItBecomesDurable(t *testing.T) {
	out := &lockedBuffer{}
	m := &model{replies: []string{"ACTION: ls -l", "what now?", "ACTION: echo \x1b[2J", "FINAL: done"}, out: out}
	store := &seamstest.MemStore{}
	def := engine.Definition{Model: m, Parser: seamstest.Parser{}, Store: store, Events: progress.New(out)}
	req := engine.Request{RunID: "p-1", Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe,
		Budget: engine.Budget{MaxSteps: 8, MaxActions: 8, MaxConsecutiveParseFailures: 2, MaxPromptChars: 1 << 20}}
	res, err := engine.Run(context.Background(), def, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.EventDeliveryFailures != 0 {
		t.Fatalf("%d event deliveries failed", res.EventDeliveryFailures)
	}
	want := "p-1 step 0: action ls -l -> executed, 11 tokens\n" +
		"p-1 step 1: reply not parsed: expected FINAL:, ACTION: or TOOL <name> <json> -> -, 21 tokens\n" +
		"p-1 step 2: action \"echo \\x1b[2J\" -> executed, 31 tokens\n" +
		"p-1 step 3: final answer -> -, 41 tokens\n"
	if got := out.String(); got != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", got, want)
	}
	if got := fmt.Sprint(m.seen); got != "[0 1 2 3]" {
		t.Fatalf("lines written before each model call: %s, want [0 1 2 3] (each step's line before the next step)", got)
	}
}

// TestLongTextIsShortenedTo60Runes: an action, tool arguments or a parse
// error longer than 60 runes is cut to 59 and "…", counting runes, not
// bytes; one of 60 is printed whole.
func TestLongTextIsShortenedTo60Runes(t *testing.T) {
	long := strings.Repeat("é", 70)
	whole := strings.Repeat("x", 60)
	status := events.StatusExecuted
	for _, c := range []struct {
		action string
		want   string
	}{
		{long, "r step 0: action " + strings.Repeat("é", 59) + "… -> executed, - tokens"},
		{whole, "r step 0: action " + whole + " -> executed, - tokens"},
	} {
		action := c.action
		got := progress.Line("r", events.StepRecord{Action: &action, ActionStatus: &status}, nil)
		if got != c.want {
			t.Errorf("Line of a %d-rune action\n = %q\nwant %q", len([]rune(c.action)), got, c.want)
		}
	}
}
