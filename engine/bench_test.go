package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// Benchmarks of the engine beside their physical floors, measured in the
// same run. Each pair is named <Name>/floor and <Name>/polyloop; `make
// bench` prints the ratios (cmd/polyloop-benchtable). One op is one step
// unless a name says otherwise.

// benchModel answers every call with a tool-less action until call
// `steps`, then a final answer. It keeps nothing.
type benchModel struct{ steps int }

func (m benchModel) Call(_ context.Context, c seams.ModelCall) (events.ModelReply, error) {
	if c.CallIndex >= m.steps {
		return events.ModelReply{CallID: "c", Content: "FINAL: done"}, nil
	}
	return events.ModelReply{CallID: "call-1234", Content: "ACTION: ls -la /workspace"}, nil
}
func (benchModel) Parameters() map[string]string { return nil }

type benchExecutor struct{}

func (benchExecutor) Execute(context.Context, seams.ActionCall) (events.ActionOutcome, error) {
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: "total 12\ndrwxr-xr-x 2 agent agent 4096 main.go"}, nil
}
func (benchExecutor) Parameters() map[string]string { return nil }

func benchRequest(runID string, steps int) engine.Request {
	return engine.Request{RunID: runID, Executor: benchExecutor{}, ModelReplayPolicy: events.ReplaySafe,
		Budget:  engine.Budget{MaxSteps: steps + 1, MaxActions: steps + 1, MaxConsecutiveParseFailures: 1, MaxPromptChars: 1 << 30},
		Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "list the workspace")}}}
}

// stepEvents are the bytes one action step writes, grouped as the two
// coalesced transactions: [model result, action intent] and
// [step completed, next model intent].
func stepEvents(b *testing.B) [][][]byte {
	reply := events.ModelReply{CallID: "call-1234", Content: "ACTION: ls -la /workspace"}
	action := "ls -la /workspace"
	status := events.StatusExecuted
	callID := "call-1234"
	outcome := events.ActionOutcome{Status: status, Observation: "total 12\ndrwxr-xr-x 2 agent agent 4096 main.go"}
	rid := func() string { return ulid.Make().String() }
	groups := [][]events.Event{
		{events.ModelCallResult{RunID: "bench", ResultID: rid(), Reply: &reply},
			events.Intent{RunID: "bench", IntentKind: events.IntentAction, CallIndex: 7, ResultID: rid(), ReplayPolicy: events.ReplayNever}},
		{events.StepCompleted{RunID: "bench", ResultID: rid(), ActionOutcome: &outcome, Step: events.StepRecord{
			StepIdx: 7, RawOutput: reply.Content, ContentChars: 25, Action: &action, ParseOK: true, Observation: outcome.Observation,
			PromptChars: 900, CallID: &callID, StepWallMs: 3, ActionStatus: &status, SchemaVersion: events.CurrentSchemaVersion}},
			events.Intent{RunID: "bench", IntentKind: events.IntentModelCall, CallIndex: 8, ResultID: rid(), ReplayPolicy: events.ReplaySafe}},
	}
	var out [][][]byte
	for _, g := range groups {
		var vals [][]byte
		for _, ev := range g {
			v, err := events.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			vals = append(vals, v)
		}
		out = append(out, vals)
	}
	return out
}

func openBolt(b *testing.B, noSync bool) *bolt.DB {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "floor.db"), 0o600, &bolt.Options{NoSync: noSync})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func openStore(b *testing.B, o kv.Options) *kv.Store {
	s, err := kv.Open(filepath.Join(b.TempDir(), "kv.db"), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkStepLatency: one run's durable step (fsync on) against two raw
// bbolt Updates of the same bytes. Target: ≤ 1.15×, 2 transactions a step.
func BenchmarkStepLatency(b *testing.B) {
	b.Run("floor", func(b *testing.B) {
		db, groups := openBolt(b, false), stepEvents(b)
		var ids events.IDSource
		for b.Loop() {
			for _, g := range groups {
				if err := kvtest.BoltFloor(db, &ids, []byte("bench"), g); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("polyloop", func(b *testing.B) {
		store := openStore(b, kv.Options{})
		def := engine.Definition{Model: benchModel{steps: b.N}, Parser: seamstest.Parser{}, Store: store}
		b.ResetTimer()
		before := store.Transactions()
		r, err := engine.Run(context.Background(), def, benchRequest("bench", b.N))
		if err != nil || len(r.Steps) != b.N+1 {
			b.Fatalf("%v after %d steps: %v", r.StopReason, len(r.Steps), err)
		}
		b.ReportMetric(float64(store.Transactions()-before)/float64(b.N), "txs/step")
	})
}

// BenchmarkConcurrentRuns: step throughput of N runs sharing one store
// (fsync on, group commit). ns/op is wall time per step over all runs;
// compare runs=64 with runs=1 (target ≥ 12× the throughput).
func BenchmarkConcurrentRuns(b *testing.B) {
	for _, n := range []int{1, 8, 64, 256} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			store := openStore(b, kv.Options{})
			concurrentRuns(b, n, store, false)
			b.ReportMetric(float64(store.Transactions())/float64(b.N), "txs/step")
		})
	}
}

// BenchmarkConcurrentTextRuns is BenchmarkConcurrentRuns with issue 16's
// step: a 2 KB model reply and a 4 KB observation of real text (see
// BenchmarkStorageBytes). Target: 64 runs ≥ 12x runs=1's throughput.
func BenchmarkConcurrentTextRuns(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			store := openStore(b, kv.Options{})
			concurrentRuns(b, n, store, true)
			b.ReportMetric(float64(store.Transactions())/float64(b.N), "txs/step")
		})
	}
}

// concurrentRuns drives b.N steps in all on store from n goroutines, each
// running runs of up to 20 steps one after another; text: with issue 16's
// 2 KB replies and 4 KB observations instead of short ones.
func concurrentRuns(b *testing.B, n int, store seams.RunStore, text bool) {
	const stepsPerRun = 20
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run := 0; ; run++ {
				left := int64(b.N) - next.Add(stepsPerRun) + stepsPerRun
				if left <= 0 {
					return
				}
				steps := int(min(left, stepsPerRun))
				def := engine.Definition{Model: benchModel{steps: steps - 1}, Parser: seamstest.Parser{}, Store: store}
				req := benchRequest(fmt.Sprintf("w%d-%d", w, run), steps)
				if text {
					def.Model, req.Executor = textModel{steps: steps - 1}, textExecutor{}
				}
				if _, err := engine.Run(context.Background(), def, req); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkStepCPU: the engine's CPU per step with no fsync (the in-memory
// store, which encodes every event), against msgpack encoding and decoding
// the step's events. Target ≤ 3×; allocations per step are reported.
func BenchmarkStepCPU(b *testing.B) {
	b.Run("floor", func(b *testing.B) {
		groups := stepEvents(b)
		var evs []events.Event
		for _, g := range groups {
			for _, v := range g {
				if err := events.Seal(v, "bench", ulid.ULID{}); err != nil {
					b.Fatal(err)
				}
				env, err := events.Unmarshal("bench", ulid.ULID{}, v)
				if err != nil {
					b.Fatal(err)
				}
				evs = append(evs, env.Event)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			for _, ev := range evs {
				v, err := events.Marshal(ev)
				if err != nil {
					b.Fatal(err)
				}
				if err := events.Seal(v, "bench", ulid.ULID{}); err != nil {
					b.Fatal(err)
				}
				if _, err := events.Unmarshal("bench", ulid.ULID{}, v); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("polyloop", func(b *testing.B) {
		const stepsPerRun = 20
		b.ReportAllocs()
		runs := (b.N + stepsPerRun - 1) / stepsPerRun
		store := &seamstest.MemStore{}
		def := engine.Definition{Model: benchModel{steps: stepsPerRun - 1}, Parser: seamstest.Parser{}, Store: store}
		b.ResetTimer()
		for i := range runs {
			if _, err := engine.Run(context.Background(), def, benchRequest(fmt.Sprint("r", i), stepsPerRun)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(runs*stepsPerRun), "ns/step")
	})
}

// longRun writes a run of n tool-less action steps to a fresh store file
// (fsync off) that stops, as a crash would leave it, with the last step's
// action in doubt; it returns the path.
func longRun(b *testing.B, n int) string {
	path := filepath.Join(b.TempDir(), fmt.Sprintf("long-%d.db", n))
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// 2n appends: [run_started, intent 0], then two per step; the next
	// append would complete the last step.
	store := &proptest.CrashingStore{Inner: s, After: 2 * n}
	def := engine.Definition{Model: benchModel{steps: n + 10}, Parser: seamstest.Parser{}, Store: store}
	req := benchRequest("long", n)
	req.Budget.MaxSteps = n
	if _, err := engine.Run(context.Background(), def, req); !errors.Is(err, proptest.ErrCrashed) {
		b.Fatalf("long run: %v", err)
	}
	return path
}

// discardAppends serves a read-only store's streams and accepts appends
// without keeping them, so Resume can be repeated on one log.
type discardAppends struct {
	*kv.Store
	ids events.IDSource
}

func (d *discardAppends) Append(_ context.Context, _ string, _ ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	out := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		if _, err := events.Marshal(ev); err != nil {
			return nil, err
		}
		out[i] = events.Envelope{ID: d.ids.Next(time.Now()), Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
	}
	return out, nil
}

// BenchmarkResume: Resume of a 10,000-step run (load, structural checks,
// replay through the machine, the tail's plan and its one append) against a
// raw cursor read and decode of its events. One op is one resume. Also at
// 1,000 steps, to show the cost is linear in the log's length (ns/event).
func BenchmarkResume(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		path := longRun(b, n)
		b.Run(fmt.Sprintf("steps=%d/floor", n), func(b *testing.B) {
			db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			count := 0
			for b.Loop() {
				count = 0 // events read
				err := db.View(func(tx *bolt.Tx) error {
					// The file holds this one run, so a cursor over kv's log
					// reads its events in order; each value is led by kv's
					// 28-byte link header (kv/layout.go).
					c := tx.Bucket([]byte("log")).Cursor()
					for k, v := c.First(); k != nil; k, v = c.Next() {
						if _, err := events.Unmarshal("long", ulid.ULID(k), v[28:]); err != nil {
							return err
						}
						count++
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*count), "ns/event")
		})
		b.Run(fmt.Sprintf("steps=%d/polyloop", n), func(b *testing.B) {
			s, err := kv.Open(path, kv.Options{ReadOnly: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			def := engine.Definition{Model: benchModel{steps: n + 10}, Parser: seamstest.Parser{}, Store: &discardAppends{Store: s}}
			req := benchRequest("long", n)
			req.Budget.MaxSteps = n
			count := 4*n - 1
			for b.Loop() {
				r, err := engine.Resume(context.Background(), def, req)
				if err != nil || r.StopReason != events.StopResumeStateUnknown || len(r.Steps) != n-1 {
					b.Fatalf("resume: %v, %s after %d steps", err, r.StopReason, len(r.Steps))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*count), "ns/event")
		})
	}
}
