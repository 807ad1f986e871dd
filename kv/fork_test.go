package kv

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

// TestForkRunKeepsTheRunForkerContract, in both layouts.
func TestForkRunKeepsTheRunForkerContract(t *testing.T) {
	for _, format := range []string{formatLog, formatBuckets} {
		t.Run(format, func(t *testing.T) {
			proptest.RunForkerContract(t, func(t *testing.T) proptest.ForkStore {
				s, err := Open(filepath.Join(t.TempDir(), "runs.db"), Options{NoSync: true, format: format})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}, storedValues)
		})
	}
}

// storedValues is the sealed values s stores for run, read as Load reads
// them.
func storedValues(t *testing.T, fs proptest.ForkStore, run string) [][]byte {
	t.Helper()
	s := fs.(*Store)
	var out [][]byte
	err := s.db.View(func(tx *bolt.Tx) error {
		info, indexed, err := readInfo(tx.Bucket(indexBucket), s.layout.entryKey(tx, run), run)
		if err != nil {
			return err
		}
		chain, problems, _ := s.layout.values(tx, run, info, indexed)
		if len(problems) > 0 {
			t.Errorf("run %q: %v", run, problems)
		}
		for _, c := range chain {
			out = append(out, bytes.Clone(c.sealed))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the values of run %q: %v", run, err)
	}
	return out
}

// TestAStepAfterAForkRefersToThePrefixsLatestReply: the fork's latest
// reply is known as of its tail (the prefix's), so a step appended right
// after it stores its raw output as a reference to that reply, as after
// any append, and reads back whole.
func TestAStepAfterAForkRefersToThePrefixsLatestReply(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "runs.db"), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	src := proptest.LongReplyStream("src")
	envs, err := s.Append(ctx, "src", ulid.ULID{}, src...)
	if err != nil {
		t.Fatal(err)
	}
	// Through the long reply of step 0; the fork completes the step.
	started := events.RunStarted{RunID: "f", SchemaVersion: events.CurrentSchemaVersion, Fork: &events.ForkOrigin{Run: "src", Step: 1, LastKey: envs[2].ID.String()}}
	forked, err := s.ForkRun(ctx, "f", started, "src", envs[2].ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "f", forked[2].ID, proptest.LongReplyStream("f")[3:5]...); err != nil {
		t.Fatal(err)
	}
	vals := storedValues(t, s, "f")
	if ref := []byte("raw_output_is_reply"); !bytes.Contains(vals[4], ref) || !bytes.Contains(storedValues(t, s, "src")[4], ref) {
		t.Errorf("the step after the fork stores its raw output (%d bytes), the source's the same step refers to its reply", len(vals[4]))
	}
	stream, err := s.Load(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	want := src[4].(events.StepCompleted).Step.RawOutput
	if got := stream[4].Event.(events.StepCompleted).Step.RawOutput; got != want {
		t.Errorf("the step after the fork reads back raw output %.40q…, want %.40q…", got, want)
	}
}
