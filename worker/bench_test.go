package worker_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/worker"
)

// A benchmark run: benchSteps action steps, then a final answer; each of
// its benchSteps+1 model calls takes benchCall.
const (
	benchSteps = 5
	benchCall  = 200 * time.Millisecond
	benchClaim = 100 * time.Millisecond
)

// slowModel waits benchCall, then names an action, or answers after
// benchSteps actions.
type slowModel struct{}

func (slowModel) Call(ctx context.Context, c seams.ModelCall) (events.ModelReply, error) {
	t := time.NewTimer(benchCall)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return events.ModelReply{}, ctx.Err()
	}
	if c.CallIndex >= benchSteps {
		return events.ModelReply{CallID: "c", Content: "FINAL: done"}, nil
	}
	return events.ModelReply{CallID: fmt.Sprint("c", c.CallIndex), Content: fmt.Sprintf("ACTION: step %d of %s", c.CallIndex, c.RunID)}, nil
}

func (slowModel) Parameters() map[string]string { return nil }

func benchAgent(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error) {
	return engine.Definition{Model: slowModel{}, Parser: seamstest.Parser{}},
		engine.Request{Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe,
			Budget: engine.Budget{MaxSteps: benchSteps + 2, MaxActions: benchSteps + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}, nil
}

// BenchmarkPool: n runs submitted to three working pools, each run waiting
// on a slow model as a service's runs do. One op is one round: the n runs
// submitted at once (64 submitters) while the pools work, and driven to
// their end by them, fsync on. On PostgreSQL the three pools have a store
// each (three owners, as three processes have; a connection pool of 16
// each); on a bbolt file they share the one store a process holds. The
// pools claim every benchClaim (Options.ClaimInterval) and drive up to
// 1,024 runs each.
//
// The ideal is every run waiting in parallel: a run of S action steps makes
// S+1 model calls, so a round takes at least (S+1) × 200 ms = 1.2 s;
// of-ideal is that over the measured round. Target: ≥ 0.8 at runs=2048.
func BenchmarkPool(b *testing.B) {
	for _, st := range []struct {
		name string
		open func(b *testing.B) []seams.RunStore
	}{
		{"kv", func(b *testing.B) []seams.RunStore {
			s, err := kv.Open(filepath.Join(b.TempDir(), "runs.db"), kv.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return []seams.RunStore{s, s, s}
		}},
		{"postgres", func(b *testing.B) []seams.RunStore {
			dsn, schema := pgtest.DurableDSN(b), pgtest.Schema(b)
			var out []seams.RunStore
			for range 3 {
				s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Schema: schema, MaxConns: 16})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				out = append(out, s)
			}
			return out
		}},
	} {
		for _, n := range []int{256, 2048} {
			b.Run(fmt.Sprintf("store=%s/runs=%d/workers=3", st.name, n), func(b *testing.B) {
				stores := st.open(b)
				var finished atomic.Int64
				var failed atomic.Pointer[error]
				var pools []*worker.Pool
				for _, s := range stores {
					p, err := worker.New(s, map[string]worker.Agent{"bench": benchAgent}, worker.Options{
						Concurrency: 1024, ClaimInterval: benchClaim,
						Done: func(runID string, res events.RunResult, err error) {
							switch {
							case err == nil && res.StopReason == events.StopAgentFinished:
								finished.Add(1)
							case err == nil:
								err = fmt.Errorf("run %s stopped %s", runID, res.StopReason)
								failed.Store(&err)
							case errors.Is(err, engine.ErrRunBusy):
								// Another drive of the run has it: a claim that
								// raced a Submit's own hold, say.
							default:
								failed.Store(&err)
							}
						}})
					if err != nil {
						b.Fatal(err)
					}
					pools = append(pools, p)
				}
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for _, p := range pools {
					wg.Go(func() { p.Work(ctx) })
				}
				defer func() {
					cancel()
					wg.Wait()
				}()
				var submitTotal time.Duration
				round := func(name string) {
					began := time.Now()
					finished.Store(0)
					var sw sync.WaitGroup
					for g := range 64 {
						sw.Go(func() {
							for i := g; i < n; i += 64 {
								if _, err := pools[i%3].Submit(context.Background(), "bench", fmt.Sprintf("%s-%d", name, i), nil); err != nil {
									failed.Store(&err)
								}
							}
						})
					}
					sw.Wait()
					submitted := time.Since(began)
					for finished.Load() < int64(n) {
						if err := failed.Load(); err != nil {
							b.Fatalf("round %s: %v", name, *err)
						}
						time.Sleep(2 * time.Millisecond)
					}
					if name != "warm" {
						submitTotal += submitted
					}
				}
				round("warm")
				for r := 0; b.Loop(); r++ {
					round(fmt.Sprint(r))
				}
				ideal := time.Duration(benchSteps+1) * benchCall
				perRound := b.Elapsed() / time.Duration(b.N)
				b.ReportMetric(float64(ideal)/float64(perRound), "of-ideal")
				b.ReportMetric(float64(n*benchSteps)/perRound.Seconds(), "steps/s")
				b.ReportMetric((submitTotal / time.Duration(b.N)).Seconds(), "s-submitting")
			})
		}
	}
}
