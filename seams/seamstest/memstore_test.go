package seamstest_test

import (
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestMemStoreKeepsTheRunStoreContract(t *testing.T) {
	proptest.RunStoreContract(t, func(*testing.T) seams.RunStore { return seamstest.NewMemStore() })
}

func TestMemStoreKeepsTheRunLeaseContract(t *testing.T) {
	proptest.RunLeaseContract(t, func(_ *testing.T, n int, _ time.Duration) ([]seams.RunStore, func(int)) {
		s := new(seamstest.MemStore)
		fleet := make([]seams.RunStore, n)
		for i := range fleet {
			fleet[i] = s
		}
		return fleet, nil
	})
}

func TestMemStoreKeepsTheRunQueueContract(t *testing.T) {
	proptest.RunQueueContract(t, func(*testing.T) proptest.QueueStore { return new(seamstest.MemStore) }, nil)
}

func TestMemStoreKeepsTheRunDeleterContract(t *testing.T) {
	proptest.RunDeleterContract(t, func(*testing.T) proptest.DeletingStore { return new(seamstest.MemStore) })
}

// TestMemStoreReportsDamageAsCorruption: a value damaged in memory is
// reported by Load as every store reports damage.
func TestMemStoreReportsDamageAsCorruption(t *testing.T) {
	proptest.CorruptionContract(t, func(*testing.T) seams.RunStore { return new(seamstest.MemStore) }, []proptest.StoreDamage{
		{Name: "a bit of a value flipped", At: 3, Apply: damageValue(3, func(v []byte) []byte { v[len(v)/2] ^= 0x10; return v })},
		{Name: "a value cut short", At: 6, Apply: damageValue(6, func(v []byte) []byte { return v[:len(v)/2] })},
		{Name: "the last value emptied", At: 14, Apply: damageValue(14, func([]byte) []byte { return nil })},
	})
}

// damageValue damages the i-th value of a MemStore's run with change.
func damageValue(i int, change func([]byte) []byte) func(*testing.T, seams.RunStore, string, []events.Envelope) seams.RunStore {
	return func(t *testing.T, s seams.RunStore, runID string, _ []events.Envelope) seams.RunStore {
		if !s.(*seamstest.MemStore).Damage(runID, i, change) {
			t.Fatalf("run %q holds no event %d", runID, i)
		}
		return s
	}
}

func TestMemStoreKeepsTheRunForkerContract(t *testing.T) {
	proptest.RunForkerContract(t, func(*testing.T) proptest.ForkStore { return new(seamstest.MemStore) },
		func(t *testing.T, s proptest.ForkStore, run string) [][]byte {
			var out [][]byte
			// A change that keeps each value as it is: a read of it.
			for i := 0; s.(*seamstest.MemStore).Damage(run, i, func(v []byte) []byte { out = append(out, v); return v }); i++ {
			}
			return out
		})
}
