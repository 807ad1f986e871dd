package seams_test

import (
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// TestChecksumCoversEveryFieldAndTheKey: changing any field of an entry,
// or the key it is filed under, changes its checksum; and the checksum of
// a fixed entry is pinned, since stores keep it on disk (kv's index
// entries, pgstore's runs rows).
func TestChecksumCoversEveryFieldAndTheKey(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	base := seams.RunInfo{RunID: "r", Status: seams.StatusFinished, Steps: 3, Events: 12, StopReason: events.StopAgentFinished,
		FirstEvent: t0, LastEvent: t0.Add(time.Second), LastID: ulid.MustParse("01ARZ3NDEKTSV4RRFFQ69G5FAV")}
	key := []byte("k")
	if got, want := base.Checksum(key), uint32(0x2d696380); got != want {
		t.Errorf("checksum of the fixed entry is %#x, was %#x: entries already stored would fail theirs", got, want)
	}
	changes := map[string]func(r *seams.RunInfo){
		"run id":      func(r *seams.RunInfo) { r.RunID = "s" },
		"status":      func(r *seams.RunInfo) { r.Status = seams.StatusRunning },
		"steps":       func(r *seams.RunInfo) { r.Steps++ },
		"events":      func(r *seams.RunInfo) { r.Events++ },
		"stop reason": func(r *seams.RunInfo) { r.StopReason = events.StopStepBudget },
		"first event": func(r *seams.RunInfo) { r.FirstEvent = r.FirstEvent.Add(time.Microsecond) },
		"last event":  func(r *seams.RunInfo) { r.LastEvent = r.LastEvent.Add(time.Microsecond) },
		"last key":    func(r *seams.RunInfo) { r.LastID[15] ^= 1 },
	}
	for name, change := range changes {
		r := base
		change(&r)
		if r.Checksum(key) == base.Checksum(key) {
			t.Errorf("%s changed, the checksum did not", name)
		}
	}
	if base.Checksum([]byte("j")) == base.Checksum(key) || base.Checksum(nil) == base.Checksum(key) {
		t.Error("the key changed, the checksum did not")
	}
	// A field's bytes cannot pass for its neighbour's: strings are
	// length-prefixed.
	a := seams.RunInfo{RunID: "ab", Status: "c"}
	b := seams.RunInfo{RunID: "a", Status: "bc"}
	if a.Checksum(nil) == b.Checksum(nil) {
		t.Error("run id and status are not delimited")
	}
}
