package proptest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// A StoreDamage is one way a store's stored run is damaged behind the
// store's back, as a disk or a careless hand would damage it.
type StoreDamage struct {
	Name string
	// At is the position (from 0) of the first event of the stream the
	// damage reaches; the stream's length when it reaches none of them
	// (the run's index entry, an event added after the tail).
	At int
	// Apply damages run runID of s, stored as stream, and returns the
	// store to read it from: s, or s reopened when its file must be closed
	// to be changed.
	Apply func(t *testing.T, s seams.RunStore, runID string, stream []events.Envelope) seams.RunStore
}

// CorruptionContract checks that a store reports each of damages as the
// one kind of error every reader understands: Load returns an error that
// matches events.ErrCorruption and wraps an *events.DamageError, together
// with the events that still decode (every event before the damage among
// them); Scan, when the store has it, hands over the same events and
// returns such an error too; LoadAfter, when the store is a
// seams.RunTailer, returns from every event before the damage exactly
// what Load returns after it, with such an error; and Runs, when the
// store lists runs, lists the run. open must return a new, empty store.
func CorruptionContract(t *testing.T, open func(t *testing.T) seams.RunStore, damages []StoreDamage) {
	ctx := context.Background()
	for _, d := range damages {
		t.Run(d.Name, func(t *testing.T) {
			const run = "damaged"
			s := open(t)
			sound := SoundStream(run)
			first, err := s.Append(ctx, run, ulid.ULID{}, sound[:5]...)
			if err != nil {
				t.Fatal(err)
			}
			rest, err := s.Append(ctx, run, first[len(first)-1].ID, sound[5:]...)
			if err != nil {
				t.Fatal(err)
			}
			stream := append(first, rest...)
			if d.At < 0 || d.At > len(stream) {
				t.Fatalf("the damage is at event %d of a stream of %d", d.At, len(stream))
			}
			s = d.Apply(t, s, run, stream)

			loaded, err := s.Load(ctx, run)
			damage(t, "Load", err)
			if len(loaded) < d.At || !reflect.DeepEqual(loaded[:d.At], stream[:d.At]) {
				t.Errorf("Load returned %d events; the %d before the damage are not all among them as written", len(loaded), d.At)
			}
			if sc, ok := s.(seams.RunScanner); ok {
				var scanned []events.Envelope
				err := sc.Scan(ctx, run, func(env events.Envelope) error { scanned = append(scanned, env); return nil })
				damage(t, "Scan", err)
				if !reflect.DeepEqual(scanned, loaded) {
					t.Errorf("Scan handed over %d events, Load returned %d (or they differ)", len(scanned), len(loaded))
				}
			}
			if tl, ok := s.(seams.RunTailer); ok {
				for seen := 0; seen <= d.At; seen++ {
					var last ulid.ULID
					if seen > 0 {
						last = stream[seen-1].ID
					}
					got, err := tl.LoadAfter(ctx, run, seen, last)
					damage(t, fmt.Sprintf("LoadAfter the first %d events", seen), err)
					if want := loaded[min(seen, len(loaded)):]; !sameEvents(got, want) {
						t.Errorf("LoadAfter the first %d events returned %d, Load %d after them (or they differ)", seen, len(got), len(want))
					}
				}
			}
			if r, ok := s.(seams.RunReader); ok {
				runs, err := r.Runs(ctx)
				listed := 0
				for _, info := range runs {
					if info.RunID == run {
						listed++
					}
				}
				if err != nil || listed != 1 {
					t.Errorf("Runs lists the damaged run %d times (%v), want once", listed, err)
				}
			}
		})
	}
}

// damage fails t unless err is damage as every store reports it.
func damage(t *testing.T, op string, err error) {
	t.Helper()
	var de *events.DamageError
	if !errors.Is(err, events.ErrCorruption) || !errors.As(err, &de) {
		t.Errorf("%s: %v; want an error matching events.ErrCorruption and wrapping an *events.DamageError", op, err)
	}
}
