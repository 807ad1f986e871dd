package kv

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/proptest"
)

// BenchmarkLostUnder measures the look for a damaged copy of an id that
// finds nothing (lostUnder) at its worst: every key in its window a
// candidate, one byte or two from the id ("run-0001001" among
// "run-0000970", "run-0000972" …), so each run's first event is read. A
// new run's first append, and a read of an id never written, pay it.
func BenchmarkLostUnder(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "kv.db"), Options{NoSync: true, NoServe: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i := range 2000 {
		id := fmt.Sprintf("run-%07d", 2*i)
		if _, err := s.Append(ctx, id, ulid.ULID{}, proptest.SoundStream(id)[0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	err = s.db.View(func(tx *bolt.Tx) error {
		for i := range b.N {
			if id := fmt.Sprintf("run-%07d", 1001+2*(i%500)); lostUnder(tx, s.layout, id) != "" {
				return fmt.Errorf("%q: a damaged copy found in a sound file", id)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
