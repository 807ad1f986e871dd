package events_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func everyRecord() []events.Event {
	return append(proptest.SoundStream("run-1")[:13], proptest.FailedModelCall("run-1", 3)...)
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("missing golden file (run go test -update): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: wire encoding changed\n got %x\nwant %x", name, got, want)
	}
}

// goldenID is the key the golden values are sealed under, in run "run-1".
var goldenID = ulid.MustParse("01JDQ6Z8Y0000000000000000Z")

// sealed is ev as a store writes it under goldenID in run "run-1".
func sealed(t *testing.T, ev events.Event) []byte {
	t.Helper()
	b, err := events.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Seal(b, "run-1", goldenID); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWireEncodingIsFrozen protects every record's msgpack bytes, checksum
// included: an accidental rename, retag or reorder fails here before it
// reaches a store.
func TestWireEncodingIsFrozen(t *testing.T) {
	for i, ev := range everyRecord() {
		golden(t, fmt.Sprintf("wire/%02d_%s.msgpack", i, ev.Kind()), sealed(t, ev))
	}
}

// TestEarlierSchemaValuesStillDecode: the values a 1.0 writer stored (no
// checksum), a 1.1 writer stored (sealed, without the outcome's env_error)
// a 1.2, a 1.3, a 1.4 and a 1.5 writer stored decode to the same records.
func TestEarlierSchemaValuesStillDecode(t *testing.T) {
	for _, v := range []string{"1.0", "1.1", "1.2", "1.3", "1.4", "1.5"} {
		files, _ := filepath.Glob("testdata/wire-" + v + "/*.msgpack")
		if len(files) != len(everyRecord()) {
			t.Fatalf("%d %s golden values, want %d", len(files), v, len(everyRecord()))
		}
		for i, ev := range everyRecord() {
			b, err := os.ReadFile(files[i])
			if err != nil {
				t.Fatal(err)
			}
			env, err := events.Unmarshal("run-1", goldenID, b)
			if err != nil {
				t.Fatalf("%s: %v", files[i], err)
			}
			want := withVersion(ev, v)
			if env.SchemaVersion != v || !reflect.DeepEqual(env.Event, want) {
				t.Errorf("%s: decoded %#v, want %#v", files[i], env.Event, want)
			}
		}
	}
}

// TestAnEnvErrorKeepsItsCause: an env_error outcome's cause is stored
// (since 1.2) and comes back.
func TestAnEnvErrorKeepsItsCause(t *testing.T) {
	cause := "exec: \"/nonexistent/python\": stat /nonexistent/python: no such file or directory"
	ev := proptest.SoundStream("run-1")[4].(events.StepCompleted)
	out := events.ActionOutcome{Status: events.StatusEnvError, Observation: "The environment failed while executing the action.",
		ObservationIsSynthetic: true, EnvError: &cause}
	ev.ActionOutcome = &out
	b := sealed(t, ev)
	golden(t, "wire-env-error/step_completed.msgpack", b)
	env, err := events.Unmarshal("run-1", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	got := env.Event.(events.StepCompleted).ActionOutcome
	if got.EnvError == nil || *got.EnvError != cause {
		t.Fatalf("cause decoded as %v", got.EnvError)
	}
}

// withVersion is ev with its nested schema versions set to v.
func withVersion(ev events.Event, v string) events.Event {
	switch e := ev.(type) {
	case events.RunStarted:
		e.SchemaVersion = v
		return e
	case events.StepCompleted:
		e.Step.SchemaVersion = v
		return e
	case events.RunFinished:
		e.Result.SchemaVersion = v
		return e
	}
	return ev
}

// TestAChecksumCoversRunKeyAndBytes: a sealed value decodes only under the
// run and key it was sealed for, and not with any byte changed.
func TestAChecksumCoversRunKeyAndBytes(t *testing.T) {
	ev := proptest.SoundStream("run-1")[4]
	b := sealed(t, ev)
	if _, err := events.Unmarshal("run-1", goldenID, b); err != nil {
		t.Fatal(err)
	}
	other := goldenID
	other[15]++
	if _, err := events.Unmarshal("run-1", other, b); !errors.Is(err, events.ErrChecksum) {
		t.Errorf("under another key: got %v, want ErrChecksum", err)
	}
	if _, err := events.Unmarshal("run-2", goldenID, b); !errors.Is(err, events.ErrChecksum) {
		t.Errorf("in another run: got %v, want ErrChecksum", err)
	}
	accepted := 0
	for i := range b {
		for bit := range 8 {
			c := bytes.Clone(b)
			c[i] ^= 1 << bit
			if _, err := events.Unmarshal("run-1", goldenID, c); err == nil {
				accepted++
			}
		}
	}
	if accepted > 0 {
		t.Errorf("%d of %d single-bit flips decoded", accepted, 8*len(b))
	}
	unsealed, _ := events.Marshal(ev)
	if _, err := events.Unmarshal("run-1", goldenID, unsealed); !errors.Is(err, events.ErrChecksum) {
		t.Errorf("a value never sealed: got %v, want ErrChecksum", err)
	}
}

func TestRoundTripEveryRecord(t *testing.T) {
	id := goldenID
	for i, ev := range everyRecord() {
		b := sealed(t, ev)
		env, err := events.Unmarshal("run-1", id, b)
		if err != nil {
			t.Fatalf("record %d (%s): %v", i, ev.Kind(), err)
		}
		if env.ID != id || env.Kind != ev.Kind() || env.SchemaVersion != events.CurrentSchemaVersion {
			t.Errorf("record %d: envelope %+v", i, env)
		}
		if !reflect.DeepEqual(env.Event, ev) {
			t.Errorf("record %d: round trip\n got %#v\nwant %#v", i, env.Event, ev)
		}
	}
}

// TestStepRecordJSONNames protects the trajectory export format: exactly the
// eighteen names, in order, with null for absent values.
func TestStepRecordJSONNames(t *testing.T) {
	steps := proptest.SoundStream("run-1")
	var out bytes.Buffer
	for _, ev := range steps {
		if sc, ok := ev.(events.StepCompleted); ok {
			b, err := json.Marshal(sc.Step)
			if err != nil {
				t.Fatal(err)
			}
			out.Write(b)
			out.WriteByte('\n')
		}
	}
	golden(t, "json/steps.jsonl", out.Bytes())

	var m map[string]any
	first, _, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	if err := json.Unmarshal(first, &m); err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(`step_idx raw_output content_chars thinking_chars action parse_ok parse_error
		observation observation_is_synthetic observation_truncated_chars prompt_chars call_id step_wall_ms
		tool_name tool_arguments action_status env_reported_completion schema_version`)
	if len(m) != len(want) {
		t.Errorf("StepRecord has %d JSON fields, want %d", len(m), len(want))
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("StepRecord JSON lacks %q", k)
		}
	}
	// A parse failure has no action: absent is null, not "".
	if !strings.Contains(out.String(), `"action":null`) || !strings.Contains(out.String(), `"call_id":null`) {
		t.Error("absent StepRecord fields are not exported as null")
	}
}

func TestRunResultJSONNames(t *testing.T) {
	final := "42"
	r := events.RunResult{RunID: "run-1", StopReason: events.StopAgentFinished, FinalAnswer: &final,
		Steps: []events.StepRecord{}, SchemaVersion: events.CurrentSchemaVersion}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	r.FinalAnswer = nil
	b2, _ := json.Marshal(r)
	golden(t, "json/run_result.json", append(append(b, '\n'), append(b2, '\n')...))
}

func rawEnvelope(t *testing.T, m map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRefusesBadInput: each way a stored value can be wrong yields a
// *DecodeError wrapping the sentinel that names it.
func TestDecodeRefusesBadInput(t *testing.T) {
	intent := map[string]any{"run_id": "r", "kind": "model_call", "call_index": 0, "result_id": "x", "replay_policy": "safe"}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty bytes", nil, events.ErrMalformed},
		{"corrupt bytes", []byte{0xde, 0xad, 0xbe, 0xef, 0x01}, events.ErrMalformed},
		{"not a map", rawEnvelope(t, map[string]any{})[:0], events.ErrMalformed},
		{"an integer", []byte{0x07}, events.ErrMalformed},
		{"an empty map", []byte{0x80}, events.ErrMalformed},
		{"map claiming 4 billion entries", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'k'}, events.ErrMalformed},
		{"trailing bytes", append(rawEnvelope(t, map[string]any{"kind": "intent"}), 0x01), events.ErrMalformed},
		{"missing version", rawEnvelope(t, map[string]any{"kind": "intent", "payload": intent}), events.ErrMissingVersion},
		{"empty version", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "", "payload": intent}), events.ErrMissingVersion},
		{"unknown major", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "2.0", "payload": intent}), events.ErrUnknownMajor},
		{"garbage version", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "v-one", "payload": intent}), events.ErrUnknownMajor},
		{"unknown kind", rawEnvelope(t, map[string]any{"kind": "tool_called", "schema_version": "1.0", "payload": intent}), events.ErrUnknownKind},
		{"missing payload", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "1.0"}), events.ErrPayloadMismatch},
		{"payload is a string", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "1.0", "payload": "hi"}), events.ErrPayloadMismatch},
		{"field of wrong type", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "1.0",
			"payload": map[string]any{"run_id": "r", "kind": "model_call", "call_index": "zero", "result_id": "x", "replay_policy": "safe"}}), events.ErrPayloadMismatch},
		{"intent payload under step kind", rawEnvelope(t, map[string]any{"kind": "step_completed", "schema_version": "1.0", "payload": intent}), events.ErrPayloadMismatch},
		{"reply and failure both set", rawEnvelope(t, map[string]any{"kind": "model_call_result", "schema_version": "1.0",
			"payload": map[string]any{"run_id": "r", "result_id": "x", "reply": map[string]any{"content": "a"}, "failure": "b"}}), events.ErrPayloadMismatch},
		{"unknown stop reason", rawEnvelope(t, map[string]any{"kind": "run_finished", "schema_version": "1.0",
			"payload": map[string]any{"run_id": "r", "result": map[string]any{"run_id": "r", "stop_reason": "bored", "schema_version": "1.0"}}}), events.ErrPayloadMismatch},
		{"result without a schema version", rawEnvelope(t, map[string]any{"kind": "run_finished", "schema_version": "1.0",
			"payload": map[string]any{"run_id": "r", "result": map[string]any{"run_id": "r", "stop_reason": "cancelled"}}}), events.ErrPayloadMismatch},
		{"step of an unknown major", rawEnvelope(t, map[string]any{"kind": "step_completed", "schema_version": "1.0",
			"payload": map[string]any{"run_id": "r", "step": map[string]any{"step_idx": 0, "schema_version": "9.9"}}}), events.ErrPayloadMismatch},
		{"a 1.1 value without a checksum", rawEnvelope(t, map[string]any{"kind": "intent", "schema_version": "1.1", "payload": intent}), events.ErrChecksum},
		{"5 MB of arrays nested in each other", append(bytes.Repeat([]byte{0x91}, 5_000_000), 0xc0), events.ErrMalformed},
		{"nested 33 maps deep", append(bytes.Repeat([]byte{0x81, 0xa1, 'k'}, 33), 0xc0), events.ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := events.Unmarshal("r", ulid.ULID{}, c.b)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			var de *events.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("%T is not a *DecodeError", err)
			}
		})
	}
}

// TestDecodeAcceptsNewerMinorAndUnknownFields: a value a later 1.x writer
// stored (a field this codec does not know, in the envelope and in the
// payload; the checksum last) decodes.
func TestDecodeAcceptsNewerMinorAndUnknownFields(t *testing.T) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.EncodeMapLen(5)
	for _, f := range []any{"kind", "intent", "schema_version", "1.7", "added_later", true, "payload", map[string]any{
		"run_id": "r", "kind": "action", "call_index": 2, "result_id": "x", "replay_policy": "never", "added_later": true}} {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	b := append(buf.Bytes(), 0xa3, 'c', 'r', 'c', 0xce, 0, 0, 0, 0)
	if err := events.Seal(b, "r", goldenID); err != nil {
		t.Fatal(err)
	}
	env, err := events.Unmarshal("r", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	if in := env.Event.(events.Intent); in.CallIndex != 2 || in.IntentKind != events.IntentAction {
		t.Errorf("decoded %+v", in)
	}
}

func TestMarshalRefusesInvalidEvents(t *testing.T) {
	for _, ev := range []events.Event{
		events.Intent{RunID: "r", IntentKind: "tool", ResultID: "x", ReplayPolicy: events.ReplaySafe},
		events.Intent{RunID: "r", IntentKind: events.IntentAction, ResultID: "x"},
		events.ModelCallResult{RunID: "r", ResultID: "x"},
		events.RunStarted{SchemaVersion: "1.0"},
		events.StepCompleted{RunID: "r", ActionOutcome: &events.ActionOutcome{Status: events.StatusExecuted},
			Step: events.StepRecord{SchemaVersion: "1.0"}},
		nil,
	} {
		if _, err := events.Marshal(ev); err == nil {
			t.Errorf("Marshal(%#v) succeeded", ev)
		}
	}
}

func TestStopReasonsAreTheFrozenTen(t *testing.T) {
	want := "task_completed step_budget parse_failed_repeatedly context_overflow env_error llm_error agent_finished action_budget cancelled resume_state_unknown"
	var got []string
	for _, r := range events.StopReasons {
		got = append(got, string(r))
	}
	if strings.Join(got, " ") != want {
		t.Errorf("stop reasons changed:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
}

// TestActionStatusesAreTheFrozenThree: each of the three is valid, nothing
// else is.
func TestActionStatusesAreTheFrozenThree(t *testing.T) {
	for _, s := range []events.ActionStatus{events.StatusExecuted, events.StatusNotExecuted, events.StatusEnvError} {
		if !s.Valid() {
			t.Errorf("%q is not valid", s)
		}
	}
	for _, s := range []events.ActionStatus{"", "weird", "Executed"} {
		if s.Valid() {
			t.Errorf("%q is valid", s)
		}
	}
}

// TestAReplyKeepsItsUsage: a reply's token counts are stored (since 1.2)
// and come back, an unreported count as absent, not zero; a reply without
// usage keeps the key out of the wire map, as 1.1 wrote it.
func TestAReplyKeepsItsUsage(t *testing.T) {
	in, out, cached := int64(1200), int64(0), int64(1024)
	reply := events.ModelReply{CallID: "c1", Content: "TOOL ls {}",
		Usage: &events.Usage{InputTokens: &in, OutputTokens: &out, CachedInputTokens: &cached}}
	ev := events.ModelCallResult{RunID: "run-1", ResultID: "r1", Reply: &reply}
	b := sealed(t, ev)
	golden(t, "wire-usage/model_call_result.msgpack", b)
	env, err := events.Unmarshal("run-1", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := env.Event.(events.ModelCallResult); !reflect.DeepEqual(got, ev) || got.Reply.Usage.ReasoningTokens != nil {
		t.Fatalf("decoded %#v", got.Reply.Usage)
	}
	bare := sealed(t, events.ModelCallResult{RunID: "run-1", ResultID: "r1", Reply: &events.ModelReply{Content: "x"}})
	if bytes.Contains(bare, []byte("usage")) {
		t.Fatal("a reply without usage writes a usage key")
	}
	neg := int64(-1)
	bad := events.ModelCallResult{RunID: "run-1", ResultID: "r1", Reply: &events.ModelReply{Usage: &events.Usage{OutputTokens: &neg}}}
	if err := bad.Validate(); err == nil {
		t.Fatal("a negative count is valid")
	}
}

// TestARunKeepsItsAgentAndInput: a run started for an agent (schema 1.4)
// stores the agent's name and its input, frozen on the wire and read back
// as written; a run without one stores neither key, as 1.3 did.
func TestARunKeepsItsAgentAndInput(t *testing.T) {
	ev := events.RunStarted{RunID: "run-1", ParameterSnapshot: map[string]string{"k": "v"}, SchemaVersion: events.CurrentSchemaVersion,
		Agent: "refunds", Input: []byte(`{"order":42}`)}
	b := sealed(t, ev)
	env, err := events.Unmarshal("run-1", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env.Event, ev) {
		t.Fatalf("read back %+v, want %+v", env.Event, ev)
	}
	golden(t, "wire-agent/run_started.msgpack", b)
	ev.Agent, ev.Input = "", nil
	if plain := sealed(t, ev); bytes.Contains(plain, []byte("agent")) || bytes.Contains(plain, []byte("input")) {
		t.Fatalf("a run without an agent stores an agent or input key: %x", plain)
	}
	if err := (events.RunStarted{RunID: "r", SchemaVersion: "1.4", Input: []byte("x")}).Validate(); err == nil || !strings.Contains(err.Error(), "without an agent") {
		t.Fatalf("input without an agent: %v, want an error naming it", err)
	}
}

// TestUsageTotalsKeepUnreportedApart: totals sum what was reported and
// count the calls that reported nothing.
func TestUsageTotalsKeepUnreportedApart(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	var tot events.UsageTotals
	tot.Add(&events.Usage{InputTokens: n(100), OutputTokens: n(20), CachedInputTokens: n(64)})
	tot.Add(nil)
	tot.Add(&events.Usage{InputTokens: n(50), ReasoningTokens: n(7)})
	want := events.UsageTotals{InputTokens: 150, OutputTokens: 20, CachedInputTokens: 64, ReasoningTokens: 7, Calls: 3, CallsWithoutUsage: 1}
	if tot != want || tot.Total() != 170 {
		t.Fatalf("totals %+v (total %d), want %+v", tot, tot.Total(), want)
	}
	// A provider's absurd count saturates; it never wraps a total negative
	// (which would slip under any token budget).
	tot.Add(&events.Usage{InputTokens: n(math.MaxInt64), OutputTokens: n(5)})
	if tot.InputTokens != math.MaxInt64 || tot.Total() != math.MaxInt64 {
		t.Fatalf("saturated totals %+v, total %d", tot, tot.Total())
	}
}

// TestLargePayloadsAreStoredCompressed: a step whose texts repeat is
// stored S2-compressed (payload_s2) and decodes to the same record, as the
// zstd value (payload_z) 1.2 wrote does; a
// small one is stored plain; the checksum covers the compressed bytes; a
// value with both payload keys, or one that does not decompress, is
// malformed.
func TestLargePayloadsAreStoredCompressed(t *testing.T) {
	obs := strings.Repeat("total 12 drwxr-xr-x agent agent 4096 main.go\n", 100)
	ev := proptest.SoundStream("run-1")[4].(events.StepCompleted)
	out := events.ActionOutcome{Status: events.StatusExecuted, Observation: obs}
	ev.ActionOutcome, ev.Step.Observation = &out, "Observation: "+obs
	b := sealed(t, ev)
	golden(t, "wire-compressed/step_completed.msgpack", b)
	if !bytes.Contains(b, []byte("payload_s2")) || len(b) > len(obs)/2 {
		t.Fatalf("a %d-byte observation stored in %d bytes, compressed: %v", len(obs), len(b), bytes.Contains(b, []byte("payload_s2")))
	}
	// What 1.2 wrote (zstd, payload_z) still decodes to the same record.
	old, err := os.ReadFile("testdata/wire-compressed/step_completed-1.2-zstd.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	if env, err := events.Unmarshal("run-1", goldenID, old); err != nil || !reflect.DeepEqual(env.Event, withVersion(ev, "1.2")) || !bytes.Contains(old, []byte("payload_z")) {
		t.Fatalf("the 1.2 zstd value: %v", err)
	}
	env, err := events.Unmarshal("run-1", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env.Event, events.Event(ev)) {
		t.Fatal("the compressed record decodes differently")
	}
	if small := sealed(t, proptest.SoundStream("run-1")[1]); bytes.Contains(small, []byte("payload_s2")) {
		t.Fatal("a small payload was compressed")
	}
	flipped := bytes.Clone(b)
	flipped[len(flipped)/2] ^= 1
	if _, err := events.Unmarshal("run-1", goldenID, flipped); !errors.Is(err, events.ErrChecksum) && !errors.Is(err, events.ErrMalformed) {
		t.Fatalf("a flipped bit in compressed bytes: %v", err)
	}
}

// rawValue is a sealed value built by hand: an envelope map with the given
// fields, then the checksum.
func rawValue(t *testing.T, fields ...any) []byte {
	t.Helper()
	return rawValueAt(t, goldenID, fields...)
}

// rawValueAt is rawValue sealed under key id.
func rawValueAt(t *testing.T, id ulid.ULID, fields ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeMapLen(len(fields)/2 + 1); err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	buf.Write([]byte{0xa3, 'c', 'r', 'c', 0xce, 0, 0, 0, 0})
	b := buf.Bytes()
	if err := events.Seal(b, "run-1", id); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCompressedPayloadsAreBounded: a payload that would decompress past
// the bound (zstd, or an S2 block declaring more), one that is not what its
// key says, and a value with two payload keys are malformed, never a huge
// allocation or a panic.
func TestCompressedPayloadsAreBounded(t *testing.T) {
	enc, _ := zstd.NewWriter(nil)
	zeros := make([]byte, events.MaxPayload+1<<20) // past the bound, once for both
	bomb := enc.EncodeAll(zeros, nil)
	small := enc.EncodeAll([]byte{0x80}, nil)
	s2bomb := s2.Encode(nil, zeros)
	s2claim := append(binary.AppendUvarint(nil, 1<<40), 0) // declares a terabyte
	s2small := s2.Encode(nil, []byte{0x80})
	for name, b := range map[string][]byte{
		"a bomb":              rawValue(t, "kind", "intent", "schema_version", "1.2", "payload_z", bomb),
		"not zstd":            rawValue(t, "kind", "intent", "schema_version", "1.2", "payload_z", []byte("plain text")),
		"both payloads":       rawValue(t, "kind", "intent", "schema_version", "1.2", "payload", map[string]any{}, "payload_z", small),
		"an S2 bomb":          rawValue(t, "kind", "intent", "schema_version", "1.3", "payload_s2", s2bomb),
		"an S2 claim":         rawValue(t, "kind", "intent", "schema_version", "1.3", "payload_s2", s2claim),
		"not S2":              rawValue(t, "kind", "intent", "schema_version", "1.3", "payload_s2", []byte("plain text")),
		"S2 and zstd":         rawValue(t, "kind", "intent", "schema_version", "1.3", "payload_s2", s2small, "payload_z", small),
		"S2 and plain":        rawValue(t, "kind", "intent", "schema_version", "1.3", "payload", map[string]any{}, "payload_s2", s2small),
		"S2 of a broken walk": rawValue(t, "kind", "intent", "schema_version", "1.3", "payload_s2", s2.Encode(nil, []byte{0xdc, 0xff, 0xff})),
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := events.Unmarshal("run-1", goldenID, b)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, events.ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
		// Refused before decompressing past the bound: a bomb's 65 MiB
		// (or a claim's terabyte) is never allocated.
		if got := after.TotalAlloc - before.TotalAlloc; got > maxRefusalAlloc {
			t.Errorf("%s: refusing it allocated %d MiB", name, got>>20)
		}
	}
}

// maxRefusalAlloc bounds what refusing a damaged or forged payload may
// allocate (none of them allocates 4 KiB here), far below a bomb's size.
const maxRefusalAlloc = 1 << 20

// TestWhatMarshalWritesUnmarshalReads: the writer and the reader agree on
// the size bound. A payload up to MaxPayload round-trips, compressible or
// not; a larger one is refused when writing, with ErrTooLarge naming the
// limit — never written and then refused as damage when read.
func TestWhatMarshalWritesUnmarshalReads(t *testing.T) {
	reply := func(content string) events.Event {
		return events.ModelCallResult{RunID: "run-1", ResultID: "r", Reply: &events.ModelReply{Content: content}}
	}
	// Each text over the limit, and under it as its prefix (generated
	// once: under the race detector each 64 MiB costs seconds).
	random := hexDigits(events.MaxPayload + 1) // incompressible to S2, which has no entropy coding
	same := strings.Repeat("a", events.MaxPayload+1)
	under := events.MaxPayload - 1024 // the envelope's other fields fit beside it
	for _, tc := range []struct {
		name    string
		ev      events.Event
		tooLong bool
	}{
		{"compressible, under the limit", reply(same[:under]), false},
		{"incompressible, under the limit", reply(random[:under]), false},
		{"compressible, over the limit", reply(same), true},
		{"incompressible, over the limit", reply(random), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := events.Marshal(tc.ev)
			if tc.tooLong {
				if !errors.Is(err, events.ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(events.MaxPayload)) {
					t.Fatalf("Marshal: %v, want ErrTooLarge naming the limit %d", err, events.MaxPayload)
				}
				return
			}
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if err := events.Seal(b, "run-1", goldenID); err != nil {
				t.Fatal(err)
			}
			env, err := events.Unmarshal("run-1", goldenID, b)
			if err != nil {
				t.Fatalf("Unmarshal of what Marshal wrote: %v", err)
			}
			if !reflect.DeepEqual(env.Event, tc.ev) {
				t.Fatal("the value decodes differently")
			}
		})
	}
}

// hexDigits is n hex digits of a seeded random stream, written into the
// string as they are made (the bytes, their digits and then a copy of them
// as a string were 160 MiB more for the race detector to shadow).
func hexDigits(n int) string {
	var sb strings.Builder
	sb.Grow(n)
	src := rand.NewChaCha8([32]byte{})
	raw, digits := make([]byte, 32<<10), make([]byte, 64<<10)
	for sb.Len() < n {
		src.Read(raw)
		hex.Encode(digits, raw)
		sb.Write(digits[:min(len(digits), n-sb.Len())])
	}
	return sb.String()
}

// TestAnEventTooLargeIsRefusedBeforeItIsEncoded: texts alone over
// MaxPayload are refused with ErrTooLarge before the encoder copies them,
// so refusing a 100 MiB reply (the size of the one once lost) allocates
// next to nothing.
func TestAnEventTooLargeIsRefusedBeforeItIsEncoded(t *testing.T) {
	ev := events.ModelCallResult{RunID: "run-1", ResultID: "r", Reply: &events.ModelReply{Content: strings.Repeat("x", 100<<20)}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := events.Marshal(ev)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, events.ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(events.MaxPayload)) {
		t.Fatalf("Marshal of a 100 MiB reply: %v, want ErrTooLarge naming %d", err, events.MaxPayload)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("refusing a 100 MiB reply allocated %d KiB", got>>10)
	}
}

// TestClaimedCountsAreBounded: a sealed value whose payload claims millions
// of map entries or array elements, each item a byte or two (a 16 MiB
// RunStarted snapshot of one repeated empty key, a RunFinished with 16 Mi
// nil steps), is malformed before any decoder allocates for the claim;
// and a writer cannot store a snapshot a reader would refuse.
func TestClaimedCountsAreBounded(t *testing.T) {
	str := func(b []byte, s string) []byte { return append(append(b, 0xa0|byte(len(s))), s...) }
	count := func(b []byte, code byte, n int) []byte {
		return binary.BigEndian.AppendUint32(append(b, code), uint32(n))
	}
	const n = 16 << 20
	snapshot := count(str(str(str(str(str([]byte{0x83}, "run_id"), "run-1"), "schema_version"), "1.3"), "parameter_snapshot"), 0xdf, n)
	snapshot = append(snapshot, bytes.Repeat([]byte{0xa0, 0xa0}, n)...)
	steps := count(str(append(str(str(str([]byte{0x82}, "run_id"), "run-1"), "result"), 0x81), "steps"), 0xdd, n)
	steps = append(steps, bytes.Repeat([]byte{0xc0}, n)...)
	for _, c := range []struct {
		kind    events.Kind
		payload []byte
	}{{events.KindRunStarted, snapshot}, {events.KindRunFinished, steps}} {
		v := rawValue(t, "kind", string(c.kind), "schema_version", "1.3", "payload_s2", s2.Encode(nil, c.payload))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := events.Unmarshal("run-1", goldenID, v)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, events.ErrMalformed) || !strings.Contains(err.Error(), "more than") {
			t.Errorf("%s claiming %d items: %v, want ErrMalformed", c.kind, n, err)
		}
		// The decompressed payload (16 or 32 MiB) is all it may cost.
		if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(c.payload))+(4<<20) {
			t.Errorf("%s claiming %d items: decoding allocated %d MiB for a %d MiB payload", c.kind, n, got>>20, len(c.payload)>>20)
		}
	}
	many := make(map[string]string, events.MaxItems+1)
	for i := range events.MaxItems + 1 {
		many[fmt.Sprint(i)] = ""
	}
	if _, err := events.Marshal(events.RunStarted{RunID: "run-1", ParameterSnapshot: many, SchemaVersion: events.CurrentSchemaVersion}); err == nil ||
		!strings.Contains(err.Error(), "events.MaxItems") {
		t.Errorf("a snapshot of %d keys: %v, want a refusal naming events.MaxItems", len(many), err)
	}
}

// TestADecisionAndItsAwaitingIntentAreKept: an action intent awaiting a
// person and the decision on it (schema 1.5) are frozen on the wire and
// read back as written; an intent that awaits nothing stores none of the
// new keys, as 1.4 did.
func TestADecisionAndItsAwaitingIntentAreKept(t *testing.T) {
	args, obs := `{"amount":40}`, "refund r-7 is in the ledger"
	for name, ev := range map[string]events.Event{
		"intent_awaiting": events.Intent{RunID: "run-1", IntentKind: events.IntentAction, CallIndex: 2, ResultID: "r2a", ReplayPolicy: events.ReplayNever,
			ToolName: "refund", Awaits: events.AwaitsApproval, Arguments: `{"amount":400}`, ArgumentsSchema: `{"type":"object"}`},
		"decision_approved": events.Decision{RunID: "run-1", ResultID: "r2a", Verdict: events.VerdictApproved, By: "ana", Note: "capped", Arguments: &args},
		"decision_executed": events.Decision{RunID: "run-1", ResultID: "r2a", Verdict: events.VerdictExecuted, By: "ops", Observation: &obs},
	} {
		b := sealed(t, ev)
		env, err := events.Unmarshal("run-1", goldenID, b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(env.Event, ev) {
			t.Fatalf("%s: read back %+v, want %+v", name, env.Event, ev)
		}
		golden(t, "wire-decision/"+name+".msgpack", b)
	}
	plain := sealed(t, events.Intent{RunID: "run-1", IntentKind: events.IntentAction, CallIndex: 0, ResultID: "r", ReplayPolicy: events.ReplaySafe})
	if bytes.Contains(plain, []byte("awaits")) || bytes.Contains(plain, []byte("arguments")) {
		t.Fatalf("an intent awaiting nothing stores a 1.5 key: %x", plain)
	}
}

// TestADecisionNamesWhatIsWrongWithIt: Validate refuses each decision no
// stream could hold, naming the field.
func TestADecisionNamesWhatIsWrongWithIt(t *testing.T) {
	s := func(v string) *string { return &v }
	ok := events.Decision{RunID: "r", ResultID: "c", Verdict: events.VerdictRejected, By: "ana"}
	for _, c := range []struct {
		name string
		edit func(*events.Decision)
		want string
	}{
		{"no call", func(d *events.Decision) { d.ResultID = "" }, "result_id"},
		{"no verdict", func(d *events.Decision) { d.Verdict = "maybe" }, "verdict"},
		{"nobody", func(d *events.Decision) { d.By = "" }, "by is empty"},
		{"arguments on a rejection", func(d *events.Decision) { d.Arguments = s(`{}`) }, "only an approval"},
		{"arguments not an object", func(d *events.Decision) { d.Verdict, d.Arguments = events.VerdictApproved, s(`[1]`) }, "not a JSON object"},
		{"observation on not_executed", func(d *events.Decision) { d.Verdict, d.Observation = events.VerdictNotExecuted, s("x") }, "only a finding of executed"},
	} {
		d := ok
		c.edit(&d)
		if err := d.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a sound decision: %v", err)
	}
	if err := (events.Intent{RunID: "r", IntentKind: events.IntentModelCall, ResultID: "m", ReplayPolicy: events.ReplaySafe, Awaits: events.AwaitsApproval}).Validate(); err == nil {
		t.Fatal("a model intent awaiting approval was accepted")
	}
}

// TestAForkKeepsItsOrigin: a forked run's RunStarted (schema 1.6) keeps
// where it came from, frozen on the wire and read back as written; a run
// that is no fork stores no fork key, as 1.5 did; an origin no stream
// could hold is refused naming its field.
func TestAForkKeepsItsOrigin(t *testing.T) {
	ev := events.RunStarted{RunID: "run-1", ParameterSnapshot: map[string]string{"k": "v"}, SchemaVersion: events.CurrentSchemaVersion,
		Fork: &events.ForkOrigin{Run: "source-1", Step: 3, LastKey: "01KB8Z7R6V0000000000000000", Differences: []string{`model.name: "a" at start, now "b"`}}}
	b := sealed(t, ev)
	env, err := events.Unmarshal("run-1", goldenID, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env.Event, ev) {
		t.Fatalf("read back %+v, want %+v", env.Event, ev)
	}
	golden(t, "wire-fork/run_started.msgpack", b)
	ev.Fork = nil
	if plain := sealed(t, ev); bytes.Contains(plain, []byte("fork")) {
		t.Fatalf("a run that is no fork stores a fork key: %x", plain)
	}
	for _, c := range []struct {
		origin events.ForkOrigin
		want   string
	}{
		{events.ForkOrigin{Step: 1}, "fork.run is empty"},
		{events.ForkOrigin{Run: "run-1"}, "the run itself"},
		{events.ForkOrigin{Run: "source-1", Step: -1}, "negative"},
	} {
		bad := ev
		bad.Fork = &c.origin
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("origin %+v: %v, want an error saying %q", c.origin, err, c.want)
		}
	}
}
