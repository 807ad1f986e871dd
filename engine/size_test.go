package engine_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

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
	huge := strings.Repeat("all work and no play ", (100<<20)/21) // 100 MiB
	// Under the limit as a reply, over it once JSON escapes every '<' as \u003c.
	escaped := `TOOL search {"q": "` + strings.Repeat("<", events.MaxTextBytes/4) + `"}`
	cases := []struct {
		name  string
		turns []seamstest.Turn
		obs   string // the executor's observation ("" = the default)
		want  events.StopReason
		check func(t *testing.T, r events.RunResult)
	}{
		{"final answer of 100 MiB", seamstest.Replies("FINAL: " + huge), "", events.StopLLMError, nil},
		{"action of 100 MiB", seamstest.Replies("ACTION: " + huge), "", events.StopLLMError, nil},
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
		{"observation of 100 MiB", seamstest.Replies("ACTION: cat big.log", "FINAL: done"), huge + "é", events.StopAgentFinished,
			func(t *testing.T, r events.RunResult) {
				st := r.Steps[0]
				kept := strings.TrimPrefix(st.Observation, "Observation: ")
				if len(kept) > events.MaxTextBytes || !strings.HasPrefix(huge, kept) || !utf8.ValidString(kept) {
					t.Errorf("observation of %d bytes kept, want a prefix of at most %d", len(kept), events.MaxTextBytes)
				}
				if want := utf8.RuneCountInString(huge+"é") - utf8.RuneCountInString(kept); st.ObservationTruncatedChars != want {
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
			soundLog(t, store, "big")
			if r.StopReason != tc.want {
				t.Errorf("stopped with %s, want %s", r.StopReason, tc.want)
			}
			if tc.want == events.StopLLMError && len(a.exec.Calls()) != 0 {
				t.Error("an action ran after a reply too large to store")
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
