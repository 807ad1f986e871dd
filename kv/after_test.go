package kv

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

// TestLoadAfterReadsOnlyWhatIsNew: LoadAfter reads the events after those
// seen (in the log, back to the reply a step refers to), not the stream
// before them: damage there is Load's to find, and LoadAfter still
// answers from what it reads — while damage in what it reads is reported
// as Load reports it.
func TestLoadAfterReadsOnlyWhatIsNew(t *testing.T) {
	ctx := context.Background()
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			s, err := Open(path, Options{format: format})
			if err != nil {
				t.Fatal(err)
			}
			stream := proptest.LongReplyStream("r")
			proptest.AppendEach(t, s, "r", stream)
			written, err := s.Load(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				if v := logValue(tx, format, "r", written[4]); format == formatLog && !bytes.Contains(v, []byte("raw_output_is_reply")) {
					t.Error("the long reply's step was not written as a reference to its reply")
				}
				return changeValue(tx, format, "r", written[1], func(v []byte) { v[len(v)-10] ^= 0x10 })
			})
			if s, err = Open(path, Options{ReadOnly: true}); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Load(ctx, "r"); !errors.Is(err, events.ErrCorruption) {
				t.Fatalf("Load: %v, want the damage to event 1", err)
			}
			for seen := 2; seen <= len(written); seen++ {
				got, err := s.LoadAfter(ctx, "r", seen, written[seen-1].ID)
				if want := written[seen:]; err != nil || len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
					t.Errorf("LoadAfter the first %d events: %d events, %v; want the %d after them, read alone", seen, len(got), err, len(written)-seen)
				}
			}
			if _, err := s.LoadAfter(ctx, "r", 1, written[0].ID); !errors.Is(err, events.ErrCorruption) {
				t.Errorf("LoadAfter the first event: %v, want the damage to event 1", err)
			}
		})
	}
}

// logValue is the value stored for env in run's stream.
func logValue(tx *bolt.Tx, format, run string, env events.Envelope) []byte {
	if format == formatBuckets {
		return tx.Bucket(runsBucket).Bucket([]byte(run)).Get(env.ID[:])
	}
	return tx.Bucket(logBucket).Get(env.ID[:])
}

// BenchmarkFollowPoll: a follower's poll of a long run, reading it whole
// (Load) and reading what is new (LoadAfter).
func BenchmarkFollowPoll(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "s.db"), Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	proptest.FollowPoll(b, s)
}
