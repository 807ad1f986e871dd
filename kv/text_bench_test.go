package kv_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// BenchmarkTextAppend: the store alone (no engine) taking issue 16's step —
// a 2 KB reply and a 4 KB observation, encoded and compressed by each
// appender — from g goroutines, a step's two appends each, fsync on.
// Throughput ratio = g=1 ns/op ÷ g=64 ns/op; compare with
// BenchmarkLayoutFloor (the same bytes perfectly grouped) and engine's
// BenchmarkConcurrentTextRuns (the same steps through the engine).
func BenchmarkTextAppend(b *testing.B) {
	for _, g := range []int{1, 64} {
		b.Run(fmt.Sprint("g=", g), func(b *testing.B) {
			s := openBench(b)
			ctx := context.Background()
			tails := make([]ulid.ULID, g)
			for w := range g {
				tails[w] = startedRun(b, s, fmt.Sprint("w", w))
			}
			src := textEvents(b)
			parallelSteps(b, g, func(w int) error {
				run := fmt.Sprint("w", w)
				step := make([]events.Event, 4)
				for i, ev := range src {
					step[i] = withRun(ev, run)
				}
				envs, err := s.Append(ctx, run, tails[w], step[0])
				if err != nil {
					return err
				}
				envs, err = s.Append(ctx, run, envs[0].ID, step[1:]...)
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
