package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// What a run writes, it can read back: a model reply or an observation too
// large to store never turns a run into a log Load refuses. The texts are
// compressible, as the reply that was lost was (S2 made it small enough to
// write, and Load then refused to decompress it). Each case names the
// documented handling: a reply over events.MaxTextBytes is a failed model
// call (llm_error, nothing executed), a parse whose texts outgrow it an
// invalid decision, an observation over it is cut and the cut counted.
func TestOversizedTextsLeaveALoadableLog(t *testing.T) {
	// 100 MiB, made once: the reply texts and the observation below are
	// slices of one string (each made whole cost seconds under the race
	// detector, and held hundreds of MiB more through the test).
	texts := "ACTION: FINAL: " + strings.Repeat("all work and no play ", (100<<20)/21) + "é"
	actionHuge := texts[:len(texts)-len("é")] // "ACTION: FINAL: " and 100 MiB
	finalHuge := actionHuge[len("ACTION: "):] // "FINAL: " and 100 MiB
	hugeObs := texts[len("ACTION: FINAL: "):] // 100 MiB and a 2-byte rune
	huge := finalHuge[len("FINAL: "):]
	// Under the limit as a reply, over it once JSON escapes every '<' as \u003c.
	escaped := `TOOL search {"q": "` + strings.Repeat("<", events.MaxTextBytes/4) + `"}`
	cases := []struct {
		name  string
		turns []seamstest.Turn
		obs   string // the executor's observation ("" = the default)
		want  events.StopReason
		check func(t *testing.T, r events.RunResult)
	}{
		{"final answer of 100 MiB", seamstest.Replies(finalHuge), "", events.StopLLMError, nil},
		{"action of 100 MiB", seamstest.Replies(actionHuge), "", events.StopLLMError, nil},
		{"reply of exactly the limit", seamstest.Replies("FINAL: " + strings.Repeat("y", events.MaxTextBytes-len("FINAL: ")-len("call-0"))),
			"", events.StopAgentFinished, func(t *testing.T, r events.RunResult) {
				if r.FinalAnswer == nil || len(*r.FinalAnswer) != events.MaxTextBytes-len("FINAL: ")-len("call-0") {
					t.Error("the final answer at the limit was not kept whole")
				}
			}},
		{"tool arguments outgrowing the limit", seamstest.Replies(escaped, escaped), "", events.StopParseFailedRepeatedly,
			func(t *testing.T, r events.RunResult) {
				if pe := r.Steps[0].ParseError; pe == nil || !strings.Contains(*pe, "arguments") {
					t.Errorf("parse error %v, want one naming the arguments", pe)
				}
			}},
		{"observation of 100 MiB", seamstest.Replies("ACTION: cat big.log", "FINAL: done"), hugeObs, events.StopAgentFinished,
			func(t *testing.T, r events.RunResult) {
				st := r.Steps[0]
				kept := strings.TrimPrefix(st.Observation, "Observation: ")
				if len(kept) > events.MaxTextBytes || !strings.HasPrefix(huge, kept) || !utf8.ValidString(kept) {
					t.Errorf("observation of %d bytes kept, want a prefix of at most %d", len(kept), events.MaxTextBytes)
				}
				if want := utf8.RuneCountInString(hugeObs) - utf8.RuneCountInString(kept); st.ObservationTruncatedChars != want {
					t.Errorf("observation_truncated_chars %d, want %d", st.ObservationTruncatedChars, want)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "big", tc.turns...)
			if tc.obs != "" {
				a.exec.Respond = func(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
					return events.ActionOutcome{Status: events.StatusExecuted, Observation: tc.obs}, nil
				}
			}
			a.req.Budget.MaxPromptChars = 1 << 30
			r := a.run(t)
			stream := soundLog(t, store, "big")
			if r.StopReason != tc.want {
				t.Errorf("stopped with %s, want %s", r.StopReason, tc.want)
			}
			if tc.want == events.StopLLMError {
				if len(a.exec.Calls()) != 0 {
					t.Error("an action ran after a reply too large to store")
				}
				// The failure says why: the reply's size and the bound.
				mr := stream[2].Event.(events.ModelCallResult)
				if mr.Failure == nil || !strings.Contains(*mr.Failure, "more than the 8388608 a run stores (events.MaxTextBytes)") {
					t.Errorf("the failed call records %q, want the reply's size beside events.MaxTextBytes", failureText(mr))
				}
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			again, err := engine.Resume(context.Background(), a.def, a.req)
			if err != nil {
				t.Fatalf("Resume of the finished run: %v", err)
			}
			if again.StopReason != r.StopReason {
				t.Errorf("Resume returned %s, the run stopped with %s", again.StopReason, r.StopReason)
			}
		})
	}
}

// parserFunc is a DecisionParser made of a function.
type parserFunc func(events.ModelReply) seams.ParsedReply

func (f parserFunc) Parse(r events.ModelReply) seams.ParsedReply { return f(r) }
func (parserFunc) Parameters() map[string]string                 { return map[string]string{"kind": "func"} }

// TestNoConsumerTextOutgrowsAStoredEvent: every text a consumer's seam can
// hand a run — an executor's own env_error cause, a model client's error, a
// parser's panic, a tool name, the registry's rejection of arguments that
// quotes them once per schema branch — is bounded before it is stored, so
// no event of the run is refused as too large, least of all the one
// recording an action that already ran.
func TestNoConsumerTextOutgrowsAStoredEvent(t *testing.T) {
	over := events.MaxPayload + 1<<20
	plain := strings.Repeat("x", over/2) // made once: each parse of each case used to make its own
	anyOf, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "search", ReplayPolicy: events.ReplaySafe,
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{
			"anyOf": []any{map[string]any{"pattern": "^a*$"}, map[string]any{"pattern": "^b*$"}, map[string]any{"pattern": "^c*$"}}}}}},
		Handler: func(context.Context, map[string]any) (string, error) { return "ok", nil }})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		setup func(a *agent)
		want  events.StopReason
	}{
		{"an executor's env_error cause", func(a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: make", "FINAL: done")
			cause := strings.Repeat("stderr line\n", over/12)
			a.exec.Respond = func(context.Context, seams.ActionCall) (events.ActionOutcome, error) {
				return events.ActionOutcome{Status: events.StatusEnvError, Observation: "failed", EnvError: &cause}, nil
			}
		}, events.StopEnvError},
		{"a model client's error", func(a *agent) {
			a.model.Turns = []seamstest.Turn{{Err: errors.New(strings.Repeat("<html>bad gateway</html>", over/24))}}
		}, events.StopLLMError},
		{"a parser's panic", func(a *agent) {
			a.model.Turns = seamstest.Replies("FINAL: x", "FINAL: x")
			a.def.Parser = parserFunc(func(events.ModelReply) seams.ParsedReply { panic(plain) })
		}, events.StopParseFailedRepeatedly},
		{"a tool name", func(a *agent) {
			a.model.Turns = seamstest.Replies("TOOL x {}", "TOOL x {}")
			a.def.Parser = parserFunc(func(r events.ModelReply) seams.ParsedReply {
				return seams.ParsedReply{HistoryText: r.Content, Decision: seams.Action{Text: "call",
					ToolCall: &seams.ToolCall{Name: plain, Arguments: map[string]any{}}}}
			})
		}, events.StopParseFailedRepeatedly},
		{"a rejection quoting the arguments per schema branch", func(a *agent) {
			q := strings.Repeat("\u0085", (events.MaxTextBytes-64)/2) // 2 bytes each, 6 quoted
			a.model.Turns = seamstest.Replies(`TOOL search {"q": "`+q+`"}`, "FINAL: done")
			a.req.Tools, a.req.Executor = anyOf, anyOf.Executor()
		}, events.StopAgentFinished},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "r")
			a.req.Budget.MaxPromptChars = 1 << 30
			tc.setup(a)
			r, err := engine.Run(context.Background(), a.def, a.req)
			if err != nil {
				t.Fatalf("Run: %.300v", err)
			}
			soundLog(t, store, "r")
			if r.StopReason != tc.want {
				t.Errorf("stopped with %s, want %s", r.StopReason, tc.want)
			}
		})
	}
}

// TestSyntheticTextsAreBounded: the synthetic observations are stored in
// steps too, so a definition with one larger than a stored text is invalid
// before anything is written.
func TestSyntheticTextsAreBounded(t *testing.T) {
	huge := strings.Repeat("x", events.MaxTextBytes+1)
	for name, syn := range map[string]engine.SyntheticObservations{
		"ActionRejected": {ActionRejected: huge}, "EnvFailed": {EnvFailed: huge}, "ModelCallFailed": {ModelCallFailed: huge},
	} {
		store := openKV(t)
		a := newAgent(store, "r", seamstest.Replies("FINAL: x")...)
		a.def.Synthetic = syn
		_, err := engine.Run(context.Background(), a.def, a.req)
		if !errors.Is(err, engine.ErrInvalidDefinition) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s of %d bytes: %v, want ErrInvalidDefinition naming it", name, len(huge), err)
		}
		if stream, _ := store.Load(context.Background(), "r"); len(stream) != 0 {
			t.Errorf("%s: an invalid definition wrote %d events", name, len(stream))
		}
	}
}

// TestAStoredReplyThatNoLongerParsesToItsActionIsNotExecuted: a log written
// under other bounds holds a reply (here 9 MiB, over today's bound) and the
// action intent it led to, in doubt. Resume re-parses the reply, which no
// longer yields that action: it must not execute anything in its place,
// and stops honestly with resume_state_unknown.
func TestAStoredReplyThatNoLongerParsesToItsActionIsNotExecuted(t *testing.T) {
	store := openKV(t)
	reply := `TOOL count {"dir": "` + strings.Repeat("y", 9<<20) + `"}`
	executed := 0
	tools, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
		Handler: func(context.Context, map[string]any) (string, error) { executed++; return "3 files", nil }})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(failingReplies{store}, "r", seamstest.Replies(reply)...)
	a.req.Tools, a.req.Executor = tools, tools.Executor()
	a.req.Budget.MaxPromptChars = 1 << 30
	if _, err := engine.Run(context.Background(), a.def, a.req); err == nil {
		t.Fatal("the run's model result was written")
	}
	stream := soundLog(t, store, "r")
	model := stream[len(stream)-1].Event.(events.Intent)
	// What the engine wrote before the bound, up to a crash before the action's outcome.
	if _, err := store.Append(context.Background(), "r", stream[len(stream)-1].ID,
		events.ModelCallResult{RunID: "r", ResultID: model.ResultID, Reply: &events.ModelReply{CallID: "call-0", Content: reply}},
		events.Intent{RunID: "r", IntentKind: events.IntentAction, CallIndex: 0, ResultID: ulid.Make().String(),
			ReplayPolicy: events.ReplaySafe, ToolName: "count"}); err != nil {
		t.Fatal(err)
	}
	a.def.Store = store
	r, err := engine.Resume(context.Background(), a.def, a.req)
	if err != nil {
		t.Fatal(err)
	}
	if r.StopReason != events.StopResumeStateUnknown || executed != 0 {
		t.Fatalf("resumed to %s after executing %d actions, want resume_state_unknown and none", r.StopReason, executed)
	}
}

// failingReplies is a store that refuses to append a model result.
type failingReplies struct{ seams.RunStore }

func (s failingReplies) Append(ctx context.Context, runID string, tail ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	for _, ev := range evs {
		if ev.Kind() == events.KindModelCallResult {
			return nil, errors.New("a crash before the model result")
		}
	}
	return s.RunStore.Append(ctx, runID, tail, evs...)
}

// failureText is a model result's failure, or "(none)".
func failureText(mr events.ModelCallResult) string {
	if mr.Failure == nil {
		return "(none)"
	}
	return *mr.Failure
}
