package events_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

// bigStep is a step of the sound stream whose reply, action and
// observation are large enough to be referred to: the model result, then
// its StepCompleted.
func bigStep() (events.ModelCallResult, events.StepCompleted) {
	stream := proptest.SoundStream("run-1")
	mr, sc := stream[2].(events.ModelCallResult), stream[4].(events.StepCompleted)
	// Text that compresses like text, not like one repeated phrase.
	var rb, ob strings.Builder
	for i := range 60 {
		fmt.Fprintf(&rb, "step %d looks at f%x.go, ", i, i*7919%4093)
		fmt.Fprintf(&ob, "-rw-r--r-- 1 agent %5d Nov %2d f%x.go\n", i*7919%65521, i%30+1, i*104729%4099)
	}
	reply, obs := "TOOL list "+rb.String(), ob.String()
	action := reply[len("TOOL "):]
	r := *mr.Reply
	r.Content = reply
	mr.Reply = &r
	out := *sc.ActionOutcome
	out.Observation = obs
	sc.ActionOutcome = &out
	sc.Step.RawOutput, sc.Step.Action, sc.Step.Observation = reply, &action, "Observation: "+obs+"\n(end)"
	return mr, sc
}

// TestAStepRefersToWhatItRepeats: a StepCompleted written after its reply
// stores the reply, its action and its wrapped observation once — as
// references to the reply event and to its own outcome — and decodes in
// its stream to exactly the record written; on its own it is refused
// (ErrNeedsStream), not misread.
func TestAStepRefersToWhatItRepeats(t *testing.T) {
	mr, sc := bigStep()
	ids := []ulid.ULID{ulid.MustParse("01J00000000000000000000001"), ulid.MustParse("01J00000000000000000000002")}
	plain, err := events.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	stored := [][]byte{nil, nil}
	if stored[0], err = events.Marshal(mr); err != nil {
		t.Fatal(err)
	}
	if stored[1], err = events.AppendMarshalAfter(nil, sc, &mr.Reply.Content); err != nil {
		t.Fatal(err)
	}
	for i, v := range stored {
		if err := events.Seal(v, "run-1", ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Contains(stored[1], []byte("raw_output_is_reply")) || len(stored[1]) >= len(plain)-100 {
		t.Fatalf("the step stored in %d bytes with references, %d without", len(stored[1]), len(plain))
	}
	r := events.StreamReader{RunID: "run-1"}
	for i, v := range stored {
		r.Value(ids[i], v)
	}
	got, err := r.Stream()
	if err != nil || len(got) != 2 || !reflect.DeepEqual(got[1].Event, events.Event(sc)) {
		t.Fatalf("decoded in its stream: %v\n got %#v\nwant %#v", err, got, sc)
	}
	if _, err := events.Unmarshal("run-1", ids[1], stored[1]); !errors.Is(err, events.ErrNeedsStream) {
		t.Fatalf("decoded alone: %v, want ErrNeedsStream", err)
	}
	// Without the reply before it (or after a failed call) it is damage.
	alone := events.StreamReader{RunID: "run-1"}
	alone.Value(ids[1], stored[1])
	if _, err := alone.Stream(); err == nil || !strings.Contains(err.Error(), "holds none") || !strings.Contains(err.Error(), "(1 problem)") {
		t.Fatalf("referring to a reply the stream lacks: %v", err)
	}
}

// TestReferencesAreUsedOnlyWhenTheyHold: a reply that differs from the
// step's raw output, a writer that does not know the reply, texts too short
// to bother, and a value that stays uncompressed carry no reference to the
// reply (nor any other reference); each value decodes alone to what was
// written.
func TestReferencesAreUsedOnlyWhenTheyHold(t *testing.T) {
	mr, sc := bigStep()
	other := "another reply " + mr.Reply.Content
	small := proptest.SoundStream("run-1")[4].(events.StepCompleted)
	// Texts long enough to refer to, in a payload too small to compress:
	// the references found are dropped and the step encoded again whole.
	mid := small
	raw := "ACTION: " + strings.Repeat("list the files ", 6)
	action, obs := raw[len("ACTION: "):], strings.Repeat("main.go go.mod ", 6)
	out := *mid.ActionOutcome
	out.Observation = obs
	mid.ActionOutcome, mid.Step.RawOutput, mid.Step.Action, mid.Step.Observation = &out, raw, &action, "Observation: "+obs
	for name, c := range map[string]struct {
		ev           events.StepCompleted
		reply        *string
		uncompressed bool
	}{
		"another reply":            {sc, &other, false},
		"reply unknown":            {sc, nil, false},
		"a small step":             {small, &small.Step.RawOutput, true},
		"reply and step tiny":      {small, nil, true},
		"texts to refer to, small": {mid, &raw, true},
	} {
		v, err := events.AppendMarshalAfter(nil, c.ev, c.reply)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(v, []byte("raw_output_is_reply")) {
			t.Errorf("%s: refers to the reply", name)
		}
		if c.uncompressed && bytes.Contains(v, []byte("refs")) {
			t.Errorf("%s: a value too small to compress carries refs", name)
		}
		id := ulid.MustParse("01J00000000000000000000003")
		if err := events.Seal(v, "run-1", id); err != nil {
			t.Fatal(err)
		}
		env, err := events.Unmarshal("run-1", id, v)
		if err != nil || !reflect.DeepEqual(env.Event, events.Event(c.ev)) {
			t.Errorf("%s: decoded %v (%v)", name, env.Event, err)
		}
	}
}

// TestBrokenReferencesAreMalformed: refs that contradict the payload they
// sit beside — an action outside the raw output, a field both stored and
// referred to, refs on another kind, refs beside an uncompressed payload —
// are malformed values, never a panic or a misread.
func TestBrokenReferencesAreMalformed(t *testing.T) {
	_, sc := bigStep()
	stored := sc
	empty := ""
	stored.Step.Action = &empty
	for name, fields := range map[string][]any{
		"action outside raw output":  {"kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, stored), "refs", map[string]any{"action_at": []int{0, 1 << 20}}},
		"negative action offset":     {"kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, stored), "refs", map[string]any{"action_at": []int{-1, 3}}},
		"action stored and referred": {"kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, sc), "refs", map[string]any{"action_at": []int{0, 3}}},
		"observation stored and referred": {"kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, sc),
			"refs", map[string]any{"observation_wraps": []string{"", ""}}},
		"wraps of one part": {"kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, stored), "refs", map[string]any{"observation_wraps": []string{""}}},
		"refs on an intent": {"kind", "intent", "schema_version", "1.3", "payload_s2", s2Of(t, proptest.SoundStream("run-1")[1]),
			"refs", map[string]any{"action_at": []int{0, 0}}},
		"refs beside a plain payload": {"kind", "step_completed", "schema_version", "1.3", "payload", stored, "refs", map[string]any{"action_at": []int{0, 3}}},
	} {
		if _, err := events.Unmarshal("run-1", goldenID, rawValue(t, fields...)); !errors.Is(err, events.ErrMalformed) && !errors.Is(err, events.ErrPayloadMismatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// s2Of is ev's payload as a 1.3 writer compresses it.
func s2Of(t *testing.T, ev events.Event) []byte {
	t.Helper()
	raw, err := msgpack.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return s2.EncodeBetter(nil, raw)
}

// TestReferenceDetails: an observation stored without a prefix is still
// referred to; a short reply is stored, not referred to, even in a large
// step; a value that both stores the raw output and says it is the reply
// is damage in its stream.
func TestReferenceDetails(t *testing.T) {
	mr, sc := bigStep()
	bare := sc
	bare.Step.Observation = sc.ActionOutcome.Observation
	v, err := events.Marshal(bare)
	if err != nil || !bytes.Contains(v, []byte("observation_wraps")) {
		t.Fatalf("an unwrapped observation is not referred to (%v)", err)
	}
	short := sc
	short.Step.RawOutput, short.Step.Action = "TOOL list", nil
	reply := short.Step.RawOutput
	if v, err := events.AppendMarshalAfter(nil, short, &reply); err != nil || bytes.Contains(v, []byte("raw_output_is_reply")) {
		t.Fatalf("a %d-byte reply is referred to (%v)", len(reply), err)
	}
	// A writer gone wrong: the reply referred to and stored as well.
	both := sc
	empty := ""
	both.Step.Action = &empty
	ids := []ulid.ULID{ulid.MustParse("01J00000000000000000000001"), ulid.MustParse("01J00000000000000000000002")}
	first, err := events.Marshal(mr)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Seal(first, "run-1", ids[0]); err != nil {
		t.Fatal(err)
	}
	second := rawValueAt(t, ids[1], "kind", "step_completed", "schema_version", "1.3", "payload_s2", s2Of(t, both),
		"refs", map[string]any{"raw_output_is_reply": true})
	r := events.StreamReader{RunID: "run-1"}
	r.Value(ids[0], first)
	r.Value(ids[1], second)
	if _, err := r.Stream(); err == nil || !strings.Contains(err.Error(), "both stored and referred") {
		t.Fatalf("raw output stored and referred to: %v", err)
	}
}

// TestAReferenceNeverResolvesPastDamage: when the reply a step refers to
// does not decode, the step is reported damaged too — never filled in with
// an earlier reply of the run.
func TestAReferenceNeverResolvesPastDamage(t *testing.T) {
	mrA, scA := bigStep()
	mrB, scB := bigStep()
	replyB := "TOOL list " + strings.Repeat("another reply, longer than the first one. ", 10)
	rb := *mrB.Reply
	rb.Content = replyB
	mrB.Reply, mrB.ResultID = &rb, "r1m"
	scB.Step.RawOutput, scB.Step.Action, scB.Step.StepIdx = replyB, nil, 1
	var vals [][]byte
	for i, c := range []struct {
		ev    events.Event
		reply *string
	}{{mrA, nil}, {scA, &mrA.Reply.Content}, {mrB, nil}, {scB, &replyB}} {
		v, err := events.AppendMarshalAfter(nil, c.ev, c.reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.Seal(v, "run-1", ulid.ULID{15: byte(i + 1)}); err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	if !bytes.Contains(vals[3], []byte("raw_output_is_reply")) {
		t.Fatal("the second step does not refer to its reply")
	}
	vals[2][len(vals[2])/2] ^= 1 // the second reply is damaged
	r := events.StreamReader{RunID: "run-1"}
	for i, v := range vals {
		r.Value(ulid.ULID{15: byte(i + 1)}, v)
	}
	got, err := r.Stream()
	var damage *events.DamageError
	if !errors.As(err, &damage) || len(damage.Problems) != 2 || len(got) != 2 || !strings.Contains(err.Error(), "damaged or missing") || !strings.Contains(err.Error(), "(2 problems)") {
		t.Fatalf("%d events decoded, %v", len(got), err)
	}
}

// TestAReaderFromTheMiddleReadsBackToItsReply: a reader handed a stream
// from its middle (Earlier set) resolves a step's reference to a reply
// before its first value by reading back through Earlier — only when a
// value needs it, and only as far as that reply; what it cannot read back
// is damage, never an earlier reply.
func TestAReaderFromTheMiddleReadsBackToItsReply(t *testing.T) {
	mr, sc := bigStep()
	stream := proptest.SoundStream("run-1")
	intent := stream[3] // the action's intent, between the reply and its step
	ids := []ulid.ULID{{15: 1}, {15: 2}, {15: 3}, {15: 4}}
	var vals [][]byte
	for i, c := range []struct {
		ev    events.Event
		reply *string
	}{{stream[1], nil}, {mr, nil}, {intent, &mr.Reply.Content}, {sc, &mr.Reply.Content}} {
		v, err := events.AppendMarshalAfter(nil, c.ev, c.reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.Seal(v, "run-1", ids[i]); err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	notReply, err := events.Marshal(stream[1]) // a model intent where the reply was
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Seal(notReply, "run-1", ids[1]); err != nil {
		t.Fatal(err)
	}
	// earlier yields the values before from, newest first, counting them.
	read := 0
	earlier := func(from int, change func(i int, v []byte) []byte) func(yield func(ulid.ULID, []byte) bool) {
		return func(yield func(ulid.ULID, []byte) bool) {
			for i := from - 1; i >= 0; i-- {
				read++
				if !yield(ids[i], change(i, bytes.Clone(vals[i]))) {
					return
				}
			}
		}
	}
	same := func(_ int, v []byte) []byte { return v }
	for _, c := range []struct {
		name    string
		from    int // the first value handed to the reader
		change  func(i int, v []byte) []byte
		read    int    // values read back
		problem string // "" for none
	}{
		{"the step, after its reply and intent", 3, same, 2, ""},
		{"the intent and the step", 2, same, 1, ""},
		{"the reply and the step: nothing read back", 1, same, 0, ""},
		{"the reply damaged", 3, func(i int, v []byte) []byte {
			if i == 1 {
				v[len(v)/2] ^= 1
			}
			return v
		}, 2, "checksum"},
		{"the reply not readable", 3, func(i int, v []byte) []byte {
			if i == 1 {
				return nil
			}
			return v
		}, 2, "cannot be read"},
		{"no reply before it", 3, func(i int, v []byte) []byte {
			if i == 1 {
				return notReply
			}
			return v
		}, 3, "holds none"},
	} {
		read = 0
		r := events.StreamReader{RunID: "run-1", Earlier: earlier(c.from, c.change)}
		for i := c.from; i < len(vals); i++ {
			r.Value(ids[i], vals[i])
		}
		got, err := r.Stream()
		if read != c.read {
			t.Errorf("%s: %d values read back, want %d", c.name, read, c.read)
		}
		if c.problem == "" {
			if err != nil || len(got) != len(vals)-c.from || !reflect.DeepEqual(got[len(got)-1].Event, events.Event(sc)) {
				t.Errorf("%s: %d events, %v; want the step as written", c.name, len(got), err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.problem) || len(got) != len(vals)-c.from-1 {
			t.Errorf("%s: %d events, %v; want the step refused, saying %q", c.name, len(got), err, c.problem)
		}
	}
}
