package kv_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
)

// BenchmarkClaim measures one ClaimRuns of 10 runs and their ReleaseRun,
// beside finished=100 and finished=100000 finished runs of the same agent:
// a claim reads the queue, which holds the unfinished runs alone, so the
// two cost alike. NoSync, so that the measure is the work of reading and
// writing the queue, not the disk's flush (11 commits per cycle).
func BenchmarkClaim(b *testing.B) {
	for _, finished := range []int{100, 100_000} {
		b.Run(fmt.Sprint("finished=", finished), func(b *testing.B) {
			s, err := kv.Open(filepath.Join(b.TempDir(), "kv.db"), kv.Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			finishedAgentRuns(b, s, finished)
			ctx := context.Background()
			for i := range 10 {
				id := fmt.Sprintf("queued-%02d", i)
				if _, err := s.Append(ctx, id, ulid.ULID{}, startedFor(id, "bench")); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				claims, err := s.ClaimRuns(ctx, []string{"bench"}, 10)
				if err != nil || len(claims) != 10 {
					b.Fatalf("claimed %d runs (%v), want 10", len(claims), err)
				}
				for _, c := range claims {
					if err := s.ReleaseRun(ctx, c.RunID, "", 0); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// startedFor is run id's RunStarted for agent.
func startedFor(id, agent string) events.RunStarted {
	started := proptest.SoundStream(id)[0].(events.RunStarted)
	started.Agent = agent
	return started
}

// finishedAgentRuns appends n whole runs of agent "bench" (a sound stream
// each, started for the agent), 500 at a time, so each was queued and
// left the queue as it finished.
func finishedAgentRuns(b *testing.B, s *kv.Store, n int) {
	for i := 0; i < n; i += 500 {
		errs := make(chan error, 500)
		k := 0
		for j := i; j < i+500 && j < n; j++ {
			k++
			go func() {
				id := fmt.Sprintf("%08x-done", uint32(j)*2654435761)
				stream := proptest.SoundStream(id)
				stream[0] = startedFor(id, "bench")
				_, err := s.Append(context.Background(), id, ulid.ULID{}, stream...)
				errs <- err
			}()
		}
		for range k {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkCancelRequested measures what the engine asks as it observes
// each input of a run this Store holds: a map lookup, no disk.
func BenchmarkCancelRequested(b *testing.B) {
	s, err := kv.Open(filepath.Join(b.TempDir(), "kv.db"), kv.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := s.Append(ctx, "r", ulid.ULID{}, startedFor("r", "bench")); err != nil {
		b.Fatal(err)
	}
	release, err := s.LockRun("r")
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	if _, err := s.RequestCancel(ctx, "r", "ops"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if r, err := s.CancelRequested(ctx, "r"); r == nil || err != nil {
			b.Fatal(r, err)
		}
	}
}
