package kv_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
)

// BenchmarkTextAppend: the store alone (no engine) taking issue 16's step —
// a 2 KB reply and a 4 KB observation, encoded and compressed by each
// appender — from g goroutines, a step's two appends each, fsync on.
// Throughput ratio = g=1 ns/op ÷ g=64 ns/op; compare with
// BenchmarkLayoutFloor (the same bytes perfectly grouped) and engine's
// BenchmarkConcurrentTextRuns (the same steps through the engine).
//
// finished=20000 first fills the store with 20,000 finished runs whose ids
// scatter over the index, as a long-lived service's store holds them: the
// commits of 64 runs then rewrite the index leaves their entries sit in.
func BenchmarkTextAppend(b *testing.B) {
	for _, c := range []struct{ g, finished int }{{1, 0}, {64, 0}, {64, 20_000}} {
		name := fmt.Sprint("g=", c.g)
		if c.finished > 0 {
			name += fmt.Sprint("/finished=", c.finished)
		}
		b.Run(name, func(b *testing.B) {
			s := openBench(b)
			ctx := context.Background()
			finishedRuns(b, s, c.finished)
			tails := make([]ulid.ULID, c.g)
			ids := make([]string, c.g)
			for w := range c.g {
				ids[w] = fmt.Sprintf("%08x-live", uint32(w+1)*2246822519)
				tails[w] = startedRun(b, s, ids[w])
			}
			src := textEvents(b)
			parallelSteps(b, c.g, func(w int) error {
				step := make([]events.Event, 4)
				for i, ev := range src {
					step[i] = withRun(ev, ids[w])
				}
				envs, err := s.Append(ctx, ids[w], tails[w], step[0])
				if err != nil {
					return err
				}
				envs, err = s.Append(ctx, ids[w], envs[0].ID, step[1:]...)
				if err != nil {
					return err
				}
				tails[w] = envs[len(envs)-1].ID
				return nil
			})
			b.ReportMetric(float64(s.Transactions())/float64(b.N), "txs/step")
		})
	}
}

// finishedRuns appends n whole runs with scattered ids, 500 at a time.
func finishedRuns(b *testing.B, s *kv.Store, n int) {
	for i := 0; i < n; i += 500 {
		errs := make(chan error, 500)
		k := 0
		for j := i; j < i+500 && j < n; j++ {
			k++
			go func() {
				id := fmt.Sprintf("%08x-done", uint32(j)*2654435761)
				_, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)...)
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

// withRun is ev filed under run.
func withRun(ev events.Event, run string) events.Event {
	switch e := ev.(type) {
	case events.Intent:
		e.RunID = run
		return e
	case events.ModelCallResult:
		e.RunID = run
		return e
	case events.StepCompleted:
		e.RunID = run
		return e
	}
	return ev
}
