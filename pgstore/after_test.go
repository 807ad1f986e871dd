package pgstore_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/proptest"
)

// TestLoadAfterReadsOnlyWhatIsNew: LoadAfter reads the rows after those
// seen, not the stream before them: damage there is Load's to find, and
// LoadAfter still answers from what it reads — while damage in what it
// reads is reported as Load reports it.
func TestLoadAfterReadsOnlyWhatIsNew(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	proptest.AppendEach(t, s, "r", proptest.SoundStream("r"))
	written, err := s.Load(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	exec(t, s.Schema(), `UPDATE {{schema}}.events SET value = set_byte(value, 20, get_byte(value, 20) # 1) WHERE run_id = 'r' AND seq = 2`)
	if _, err := s.Load(ctx, "r"); !errors.Is(err, events.ErrCorruption) {
		t.Fatalf("Load: %v, want the damage to event 2", err)
	}
	for seen := 2; seen <= len(written); seen++ {
		got, err := s.LoadAfter(ctx, "r", seen, written[seen-1].ID)
		if want := written[seen:]; err != nil || len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
			t.Errorf("LoadAfter the first %d events: %d events, %v; want the %d after them, read alone", seen, len(got), err, len(want))
		}
	}
	if _, err := s.LoadAfter(ctx, "r", 1, written[0].ID); !errors.Is(err, events.ErrCorruption) {
		t.Errorf("LoadAfter the first event: %v, want the damage to event 2", err)
	}
}

// BenchmarkFollowPoll: a follower's poll of a long run, reading it whole
// (Load) and reading what is new (LoadAfter).
func BenchmarkFollowPoll(b *testing.B) {
	proptest.FollowPoll(b, open(b, pgstore.Options{}))
}
