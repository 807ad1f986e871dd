package events

import (
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// benchStep is one step's four records, as the engine writes them.
func benchStep() []Event {
	reply := ModelReply{CallID: "call-1234", Content: "ACTION: ls -la /workspace"}
	action, callID, status := "ls -la /workspace", "call-1234", StatusExecuted
	outcome := ActionOutcome{Status: status, Observation: "total 12\ndrwxr-xr-x 2 agent agent 4096 main.go"}
	return []Event{
		Intent{RunID: "bench", IntentKind: IntentModelCall, CallIndex: 7, ResultID: "01JDQ6Z8Y0000000000000000Z", ReplayPolicy: ReplaySafe},
		ModelCallResult{RunID: "bench", ResultID: "01JDQ6Z8Y0000000000000000Z", Reply: &reply},
		Intent{RunID: "bench", IntentKind: IntentAction, CallIndex: 7, ResultID: "01JDQ6Z8Y0000000000000001Z", ReplayPolicy: ReplayNever},
		StepCompleted{RunID: "bench", ResultID: "01JDQ6Z8Y0000000000000001Z", ActionOutcome: &outcome, Step: StepRecord{
			StepIdx: 7, RawOutput: reply.Content, ContentChars: 25, Action: &action, ParseOK: true, Observation: outcome.Observation,
			PromptChars: 900, CallID: &callID, StepWallMs: 3, ActionStatus: &status, SchemaVersion: CurrentSchemaVersion}},
	}
}

// BenchmarkChecksum: what the checksum adds to a step's codec work.
// /floor encodes a step's four records as schema 1.0 values (no checksum)
// and decodes them; /polyloop encodes them as 1.1 values, seals them and
// decodes them, verifying the checksum. One op is one step.
func BenchmarkChecksum(b *testing.B) {
	evs := benchStep()
	id := ulid.MustParse("01JDQ6Z8Y0000000000000000Z")
	b.Run("floor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, ev := range evs {
				v, err := msgpack.Marshal(legacyEnvelope{Kind: ev.Kind(), SchemaVersion: "1.0", Payload: ev})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Unmarshal("bench", id, v); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("polyloop", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, ev := range evs {
				v, err := Marshal(ev)
				if err != nil {
					b.Fatal(err)
				}
				if err := Seal(v, "bench", id); err != nil {
					b.Fatal(err)
				}
				if _, err := Unmarshal("bench", id, v); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// legacyEnvelope is the 1.0 stored shape: no checksum.
type legacyEnvelope struct {
	Kind          Kind   `msgpack:"kind"`
	SchemaVersion string `msgpack:"schema_version"`
	Payload       Event  `msgpack:"payload"`
}
