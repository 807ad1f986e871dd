package events

import (
	"errors"
	"fmt"
	"strings"
)

// References (schema 1.3): a StepCompleted repeats its step's texts — the
// model's reply as step.raw_output (stored already in the step's
// model_call_result) and, within it, as step.action; the observation in
// the outcome and, wrapped in the observation template, as
// step.observation. A large StepCompleted may store those fields empty and
// say in its envelope's "refs" how they are derived:
//
//   - raw_output_is_reply: step.raw_output is the content of the reply of
//     the latest model_call_result before this event in the run's stream;
//   - observation_wraps [prefix, suffix]: step.observation is prefix +
//     action_outcome.observation + suffix;
//   - action_at [offset, length]: step.action is those bytes of
//     step.raw_output.
//
// Readers see the fields filled in, exactly as written. Refs appear only
// in values whose payload is compressed (payload_s2), which no reader
// before 1.3 reads, so an older reader refuses such a value instead of
// misreading it. raw_output_is_reply needs the stream: Unmarshal alone
// refuses it (ErrNeedsStream); StreamReader fills it in. Only a writer that
// knows the run's latest reply uses it (kv does, AppendMarshalAfter).
type stepRefs struct {
	RawOutputIsReply bool     `msgpack:"raw_output_is_reply,omitempty"`
	ObservationWraps []string `msgpack:"observation_wraps,omitempty"`
	ActionAt         []int    `msgpack:"action_at,omitempty"`
}

// ReplyAfter says what a stream's latest model reply is once ev is in it:
// changed is false when ev is not a model_call_result (the latest reply
// stays what it was); otherwise content is the reply's text, nil for a
// failed call. Writers that refer to the latest reply (AppendMarshalAfter)
// and StreamReader, which resolves such references, track it by this one
// rule.
func ReplyAfter(ev Event) (content *string, changed bool) {
	mr, ok := As[ModelCallResult](ev)
	if !ok {
		return nil, false
	}
	if mr.Reply == nil {
		return nil, true
	}
	// A copy, not &mr.Reply.Content: kv keeps it across appends, while the
	// reply it came from is the caller's to change. It costs a 16-byte
	// allocation per model_call_result read, which Load and Resume accept.
	text := mr.Reply.Content
	return &text, true
}

// As is the record ev holds, whether as a T or a *T (writers may append
// either; a decoded stream holds values); false when it is another record,
// or a nil pointer.
func As[T any](ev Event) (T, bool) {
	switch e := any(ev).(type) {
	case T:
		return e, true
	case *T:
		if e != nil {
			return *e, true
		}
	}
	var zero T
	return zero, false
}

// refMin is the shortest text worth a reference.
const refMin = 64

// ErrNeedsStream: a value refers to an earlier event of its run and was
// decoded on its own; decode it in its stream (StreamReader).
var ErrNeedsStream = errors.New("events: the value refers to an earlier event of its stream")

// withRefs returns ev with what can be derived replaced by references, and
// the references; refs is nil when there is nothing to refer to. lastReply
// is the content of the latest reply before ev in its stream, if known.
func withRefs(ev Event, lastReply *string) (Event, *stepRefs) {
	sc, ok := As[StepCompleted](ev)
	if !ok {
		return ev, nil
	}
	var refs stepRefs
	step := sc.Step
	if step.Action != nil && len(*step.Action) >= refMin {
		if i := strings.Index(step.RawOutput, *step.Action); i >= 0 {
			refs.ActionAt = []int{i, len(*step.Action)}
			empty := ""
			step.Action = &empty
		}
	}
	if lastReply != nil && len(step.RawOutput) >= refMin && *lastReply == step.RawOutput {
		refs.RawOutputIsReply = true
		step.RawOutput = ""
	}
	if o := sc.ActionOutcome; o != nil && len(o.Observation) >= refMin {
		if i := strings.Index(step.Observation, o.Observation); i >= 0 {
			refs.ObservationWraps = []string{step.Observation[:i], step.Observation[i+len(o.Observation):]}
			step.Observation = ""
		}
	}
	if !refs.RawOutputIsReply && refs.ObservationWraps == nil && refs.ActionAt == nil {
		return ev, nil
	}
	sc.Step = step
	return sc, &refs
}

// resolve fills in what refs derive; reply is the stream's latest reply
// before the event, nil when the event is decoded on its own. The caller
// validates the result.
func (refs *stepRefs) resolve(ev Event, reply *streamReply) (Event, error) {
	sc, ok := ev.(StepCompleted)
	if !ok {
		return nil, fmt.Errorf("refs on a %s, which has none", ev.Kind())
	}
	step := sc.Step
	if refs.RawOutputIsReply {
		switch {
		case reply == nil:
			return nil, ErrNeedsStream
		case reply.lost:
			return nil, errors.New("step.raw_output refers to the latest model reply, and values before it are damaged or missing")
		case reply.content == nil:
			return nil, errors.New("step.raw_output refers to the latest model reply, and the stream holds none before it")
		case step.RawOutput != "":
			return nil, errors.New("step.raw_output is both stored and referred to")
		}
		step.RawOutput = *reply.content
	}
	if w := refs.ObservationWraps; w != nil {
		switch {
		case len(w) != 2:
			return nil, fmt.Errorf("observation_wraps has %d parts, not 2", len(w))
		case sc.ActionOutcome == nil:
			return nil, errors.New("step.observation wraps an outcome's observation, and there is no outcome")
		case step.Observation != "":
			return nil, errors.New("step.observation is both stored and referred to")
		}
		step.Observation = w[0] + sc.ActionOutcome.Observation + w[1]
	}
	if at := refs.ActionAt; at != nil {
		switch {
		case len(at) != 2:
			return nil, fmt.Errorf("action_at has %d parts, not 2", len(at))
		case at[0] < 0 || at[1] < 0 || at[0] > len(step.RawOutput) || at[1] > len(step.RawOutput)-at[0]:
			return nil, fmt.Errorf("action_at [%d, %d] is outside step.raw_output's %d bytes", at[0], at[1], len(step.RawOutput))
		case step.Action == nil:
			return nil, errors.New("action_at refers to a step.action that is absent")
		case *step.Action != "":
			return nil, errors.New("step.action is both stored and referred to")
		}
		action := step.RawOutput[at[0] : at[0]+at[1]]
		step.Action = &action
	}
	sc.Step = step
	return sc, nil
}
