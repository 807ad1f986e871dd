package engine_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// A fleet's run: fleetSteps action steps, then a final answer; each of its
// fleetSteps+1 model calls takes fleetCall.
const (
	fleetSteps = 5
	fleetCall  = 200 * time.Millisecond
)

// BenchmarkFleet: many runs at once in one process, each waiting on a slow
// model, as a service's runs do. Each run is an engine.Run of fleetSteps
// action steps and a final answer; its model client sleeps fleetCall
// (honouring ctx) before each reply, a ~2 KB window of real text naming an
// action; its executor answers at once with a ~4 KB observation of real
// text (the texts of BenchmarkStorageBytes). One op is one round: all n runs
// started together and driven to their end on one store, fsync on. Before
// the timed rounds, one round on the same store warms the process (its
// heap, its goroutine stacks, the store's file and map), as a service that
// has been running is warm.
//
// The ideal is every run waiting in parallel: a run of S action steps makes
// S+1 model calls, so it takes at least (S+1) × 200 ms, and n runs at most
// n × S / ((S+1) × 200 ms) action steps a second (the final answer's step
// is not counted): 1,067 for 256 runs, 8,533 for 2,048. of-ideal is the
// measured steps/s over that, which is also 1.2 s over the measured round.
// Target: ≥ 0.8 at runs=2048 on either store, PostgreSQL with a pool of at
// most 16 connections. A round whose runs fail fails the benchmark with the
// first run's error.
func BenchmarkFleet(b *testing.B) {
	for _, st := range []struct {
		name string
		open func(b *testing.B) seams.RunStore
	}{
		{"kv", func(b *testing.B) seams.RunStore { return openStore(b, kv.Options{}) }},
		{"postgres", func(b *testing.B) seams.RunStore { s, _ := openPG(b, 16); return s }},
	} {
		for _, n := range []int{256, 2048} {
			b.Run(fmt.Sprintf("store=%s/runs=%d", st.name, n), func(b *testing.B) {
				store := st.open(b)
				if err := fleetRound(store, "warm", n); err != nil {
					b.Fatalf("%d runs on %s, the warm-up round: %v", n, st.name, err)
				}
				for round := 0; b.Loop(); round++ {
					if err := fleetRound(store, fmt.Sprint(round), n); err != nil {
						b.Fatalf("%d runs on %s, round %d: %v", n, st.name, round, err)
					}
				}
				perSec := float64(b.N*n*fleetSteps) / b.Elapsed().Seconds()
				ideal := float64(n*fleetSteps) / ((fleetSteps + 1) * fleetCall).Seconds()
				b.ReportMetric(perSec, "steps/s")
				b.ReportMetric(perSec/ideal, "of-ideal")
			})
		}
	}
}

// fleetRound starts n runs at once, named after round, and waits for all of
// them; it returns the first run's error, if any, with how many failed.
func fleetRound(store seams.RunStore, round string, n int) error {
	def := engine.Definition{Model: fleetModel{}, Parser: seamstest.Parser{}, Store: store}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		first  error
		failed int
	)
	for i := range n {
		wg.Go(func() {
			req := benchRequest(fmt.Sprintf("fleet-%s-%d", round, i), fleetSteps)
			req.Executor = textExecutor{}
			r, err := engine.Run(context.Background(), def, req)
			if err == nil && (r.StopReason != events.StopAgentFinished || len(r.Steps) != fleetSteps+1) {
				err = fmt.Errorf("run %s stopped %s after %d steps, want %s after %d", req.RunID, r.StopReason, len(r.Steps), events.StopAgentFinished, fleetSteps+1)
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				failed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("%d of %d runs failed; the first: %w", failed, n, first)
	}
	return nil
}

// fleetModel waits fleetCall, then answers as textModel does for a run of
// fleetSteps steps, its window of text chosen by the run and the call.
type fleetModel struct{}

func (fleetModel) Call(ctx context.Context, c seams.ModelCall) (events.ModelReply, error) {
	t := time.NewTimer(fleetCall)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return events.ModelReply{}, ctx.Err()
	}
	if c.CallIndex >= fleetSteps {
		return events.ModelReply{CallID: "c", Content: "FINAL: done"}, nil
	}
	h := fnv.New64a()
	h.Write([]byte(c.RunID))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(c.CallIndex)))
	return events.ModelReply{CallID: fmt.Sprint("call-", c.CallIndex), Content: "ACTION: " + text(rng, replyBytes-len("ACTION: "))}, nil
}

func (fleetModel) Parameters() map[string]string { return nil }
