package kv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/proptest"
)

// oneStep is a step's four records (model intent, model result, action
// intent, step completed) for run id.
func oneStep(id string) []events.Event { return proptest.SoundStream(id)[1:5] }

func encodedStep(b *testing.B) [][]byte {
	var vals [][]byte
	for _, ev := range oneStep("bench") {
		v, err := events.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		vals = append(vals, v)
	}
	return vals
}

func openRaw(b *testing.B) *bolt.DB {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func openBench(b *testing.B) *kv.Store {
	s, err := kv.Open(filepath.Join(b.TempDir(), "kv.db"), kv.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// startedRun appends a RunStarted so step records may follow, and returns
// the run's tail.
func startedRun(b *testing.B, s *kv.Store, id string) ulid.ULID {
	envs, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)[0])
	if err != nil {
		b.Fatal(err)
	}
	return envs[0].ID
}

// BenchmarkStep measures one step's four durable records, written as four
// transactions and as two (coalesced), beside raw bbolt Updates of the same
// bytes. Compare txs=N/polyloop against txs=N/floor.
func BenchmarkStep(b *testing.B) {
	for _, txs := range []int{4, 2} {
		groups := [][]int{{0, 1}, {1, 2}, {2, 3}, {3, 4}}
		if txs == 2 {
			groups = [][]int{{0, 1}, {1, 4}} // intent | result+intent+step
		}
		b.Run(fmt.Sprintf("txs=%d/floor", txs), func(b *testing.B) {
			db, vals, run := openRaw(b), encodedStep(b), []byte("bench")
			var ids events.IDSource
			for b.Loop() {
				for _, g := range groups {
					if err := kvtest.BoltFloor(db, &ids, run, vals[g[0]:g[1]]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("txs=%d/polyloop", txs), func(b *testing.B) {
			s, step, ctx := openBench(b), oneStep("bench"), context.Background()
			tail := startedRun(b, s, "bench")
			for b.Loop() {
				for _, g := range groups {
					envs, err := s.Append(ctx, "bench", tail, step[g[0]:g[1]]...)
					if err != nil {
						b.Fatal(err)
					}
					tail = envs[len(envs)-1].ID
				}
			}
		})
	}
}

// BenchmarkConcurrentAppend measures appends of one step's records (two
// coalesced transactions) from 1, 8 and 64 goroutines, each its own run,
// beside raw bbolt Updates from as many goroutines (bbolt serialises them:
// one fsync each). ns/op is per step across all goroutines.
func BenchmarkConcurrentAppend(b *testing.B) {
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("goroutines=%d/floor", g), func(b *testing.B) {
			db, vals := openRaw(b), encodedStep(b)
			var ids events.IDSource
			parallelSteps(b, g, func(w int) error {
				run := []byte(fmt.Sprint("w", w))
				if err := kvtest.BoltFloor(db, &ids, run, vals[:1]); err != nil {
					return err
				}
				return kvtest.BoltFloor(db, &ids, run, vals[1:])
			})
		})
		b.Run(fmt.Sprintf("goroutines=%d/polyloop", g), func(b *testing.B) {
			storeSteps(b, openBench(b), g)
		})
	}
}

// storeSteps appends b.N steps' records, two appends a step as the engine
// coalesces them, from g goroutines, each its own run.
func storeSteps(b *testing.B, s *kv.Store, g int) {
	ctx := context.Background()
	tails := make([]ulid.ULID, g)
	for w := range g {
		tails[w] = startedRun(b, s, fmt.Sprint("w", w))
	}
	parallelSteps(b, g, func(w int) error {
		run := fmt.Sprint("w", w)
		step := oneStep(run)
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
}

// parallelSteps runs b.N steps spread over g goroutines.
func parallelSteps(b *testing.B, g int, step func(worker int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := step(w); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkGroupCommitNoSync separates CPU and page writing from fsync:
// the concurrent benchmark with fsync off.
func BenchmarkGroupCommitNoSync(b *testing.B) {
	for _, g := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			s, err := kv.Open(filepath.Join(b.TempDir(), "kv.db"), kv.Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			storeSteps(b, s, g)
		})
	}
}

// BenchmarkGroupedTransaction is the floor of group commit: raw bbolt
// transactions that each carry one step's two appends for G different runs
// (G nested buckets), fsync on, beside kv's equivalent (G goroutines, each
// a run, whose appends the store groups). One op is one step of one run on
// both sides: the floor does rounds of G steps until b.N.
func BenchmarkGroupedTransaction(b *testing.B) {
	for _, g := range []int{32} {
		b.Run(fmt.Sprintf("runs=%d/floor", g), func(b *testing.B) {
			db, vals := openRaw(b), encodedStep(b)
			var ids events.IDSource
			runs := make([][]byte, g)
			for i := range runs {
				runs[i] = []byte(fmt.Sprint("w", i))
			}
			b.ResetTimer()
			for done := 0; done < b.N; done += g {
				groupedRound(b, db, &ids, vals, runs, "bucket-per-run", nil)
			}
		})
		b.Run(fmt.Sprintf("runs=%d/polyloop", g), func(b *testing.B) {
			storeSteps(b, openBench(b), g)
		})
	}
}

// BenchmarkTailCheck isolates what the expected-tail rule adds to an
// append: /floor is a raw bbolt Update putting a step's events in a run
// bucket; /polyloop is the same Update preceded by what kv does for the
// tail rule (read the bucket's last key with a cursor, compare it with the
// caller's tail, mint keys after it). fsync is off, so the check's CPU cost
// is not hidden by the disk; with fsync on (BenchmarkStep) it is noise.
func BenchmarkTailCheck(b *testing.B) {
	for _, checked := range []bool{false, true} {
		name := "floor"
		if checked {
			name = "polyloop"
		}
		b.Run(name, func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			vals, run := encodedStep(b), []byte("bench")
			var ids events.IDSource
			var tail ulid.ULID
			for b.Loop() {
				err := db.Update(func(tx *bolt.Tx) error {
					root, err := tx.CreateBucketIfNotExists([]byte("runs"))
					if err != nil {
						return err
					}
					bk, err := root.CreateBucketIfNotExists(run)
					if err != nil {
						return err
					}
					if checked {
						var last ulid.ULID
						if k, _ := bk.Cursor().Last(); k != nil {
							last = ulid.ULID(k)
						}
						if last != tail {
							return fmt.Errorf("tail moved: %s, want %s", last, tail)
						}
					}
					for _, v := range vals {
						if checked {
							tail = ids.NextAfter(time.Now(), tail)
						} else {
							tail = ids.Next(time.Now())
						}
						if err := bk.Put(tail[:], v); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOpen measures what proving a file sound costs at open: /floor
// opens a store of 2,000 runs with bbolt and commits one write (bbolt then
// walks every page to rebuild its unsynced freelist); /polyloop opens it
// with kv (the file check reads every reachable page first) and appends
// one event. fsync off: this is reading and walking.
func BenchmarkOpen(b *testing.B) {
	path := filepath.Join(b.TempDir(), "big.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	for r := range 2000 {
		id := fmt.Sprintf("run-%04d", r)
		if _, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)[:9]...); err != nil {
			b.Fatal(err)
		}
	}
	s.Close()
	if fi, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(fi.Size())/(1<<20), "MiB")
	}
	n := 0
	b.Run("floor", func(b *testing.B) {
		for b.Loop() {
			db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
			if err != nil {
				b.Fatal(err)
			}
			n++
			err = db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("log")).Put([]byte(fmt.Sprint("floor", n)), []byte("x"))
			})
			if err != nil {
				b.Fatal(err)
			}
			db.Close()
		}
	})
	b.Run("polyloop", func(b *testing.B) {
		for b.Loop() {
			s, err := kv.Open(path, kv.Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			n++
			id := fmt.Sprint("open-", n)
			if _, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)[0]); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}

// BenchmarkFreelistSync weighs the alternative to the file check at open:
// keeping bbolt's freelist synced, so bbolt need not walk the file to
// rebuild it. /floor commits a step's two transactions as kv does (freelist
// not synced); /polyloop the same with the freelist written on every
// commit. fsync on: this is the price per step of the alternative.
func BenchmarkFreelistSync(b *testing.B) {
	for _, synced := range []bool{false, true} {
		name := "floor"
		if synced {
			name = "polyloop"
		}
		b.Run(name, func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{NoFreelistSync: !synced})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			vals, run := encodedStep(b), []byte("bench")
			var ids events.IDSource
			for b.Loop() {
				for _, g := range [][]int{{0, 1}, {1, 4}} {
					if err := kvtest.BoltFloor(db, &ids, run, vals[g[0]:g[1]]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkLayoutFloor: the most steps per second bbolt commits with
// perfect grouping (fsync on, 16 KiB pages as kv makes them), in three
// layouts, beside one run's step alone. Each step's values are what the
// engine stores for a 2 KB model reply and a 4 KB observation (compressed
// as events.Marshal compresses them): issue 16's step. The layouts:
//
//   - bucket-per-run: kv's first layout, a nested bucket per run;
//   - prefixed: one bucket, keys run number + ULID, so a run is one key range;
//   - one-log: one append-only bucket of all events keyed by ULID, each
//     value led by its run's previous key, plus an index entry per run.
//
// One op is one step of one run; throughput ratio = layout=one-run ns/op ÷
// the layout's.
func BenchmarkLayoutFloor(b *testing.B) {
	const g = 64
	vals := textStep(b)
	runs := make([][]byte, g)
	for i := range runs {
		runs[i] = []byte(fmt.Sprint("w", i))
	}
	for _, c := range []struct {
		name   string
		runs   [][]byte
		layout string
	}{{"layout=one-run", runs[:1], "bucket-per-run"}, {"layout=bucket-per-run/runs=64", runs, "bucket-per-run"},
		{"layout=prefixed/runs=64", runs, "prefixed"}, {"layout=one-log/runs=64", runs, "one-log"}} {
		b.Run(c.name, func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{PageSize: kv.DefaultPageSize, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			var ids events.IDSource
			tails := map[string]ulid.ULID{}
			b.ResetTimer()
			for done := 0; done < b.N; done += len(c.runs) {
				groupedRound(b, db, &ids, vals, c.runs, c.layout, tails)
			}
		})
	}
}

// textStep is a step's four values as the engine writes them for a 2 KB
// reply and a 4 KB observation cut from this package's own source (text
// that compresses like text).
func textStep(b testing.TB) [][]byte {
	var vals [][]byte
	for _, ev := range textEvents(b) {
		v, err := events.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		vals = append(vals, v)
	}
	return vals
}

// textEvents is a step's four records with issue 16's texts, cut from this
// package's source files read one after another (no one file need be long
// enough).
func textEvents(b testing.TB) []events.Event {
	files, err := filepath.Glob("*.go")
	if err != nil {
		b.Fatal(err)
	}
	var src []byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		src = append(src, data...)
	}
	if len(src) < 9096 {
		b.Fatalf("the package's source is %d bytes, too short to cut a 2 KB reply and a 4 KB observation from", len(src))
	}
	reply, obs := string(src[1000:3048]), string(src[5000:9096])
	evs := oneStep("bench")
	evs[1] = events.ModelCallResult{RunID: "bench", ResultID: "r0m", Reply: &events.ModelReply{CallID: "call-0", Content: reply}}
	sc := evs[3].(events.StepCompleted)
	sc.ActionOutcome = &events.ActionOutcome{Status: events.StatusExecuted, Observation: obs}
	sc.Step.RawOutput, sc.Step.Observation = reply, "Observation: "+obs
	evs[3] = sc
	return evs
}

// groupedRound commits one step of every run in runs as a step's two
// appends would, each transaction serving all of them, streams' pages
// filled whole, in the named layout (see BenchmarkLayoutFloor).
func groupedRound(b *testing.B, db *bolt.DB, ids *events.IDSource, vals [][]byte, runs [][]byte, layout string, tails map[string]ulid.ULID) {
	for _, part := range [][][]byte{vals[:1], vals[1:]} {
		err := db.Update(func(tx *bolt.Tx) error {
			switch layout {
			case "one-log", "prefixed":
				all, err := tx.CreateBucketIfNotExists([]byte("events"))
				if err != nil {
					return err
				}
				all.FillPercent = 1
				index, err := tx.CreateBucketIfNotExists([]byte("index"))
				if err != nil {
					return err
				}
				for n, run := range runs {
					last := tails[string(run)]
					for _, v := range part {
						id := ids.Next(time.Now())
						var key, val []byte
						if layout == "prefixed" {
							key, val = fmt.Appendf(nil, "%08d%s", n, id[:]), v
						} else {
							key, val = id[:], append(last[:len(last):len(last)], v...)
						}
						if err := all.Put(key, val); err != nil {
							return err
						}
						last = id
					}
					tails[string(run)] = last
					if err := index.Put(run, last[:]); err != nil {
						return err
					}
				}
				return nil
			}
			root, err := tx.CreateBucketIfNotExists([]byte("runs"))
			if err != nil {
				return err
			}
			for _, run := range runs {
				bk, err := root.CreateBucketIfNotExists(run)
				if err != nil {
					return err
				}
				bk.FillPercent = 1
				for _, v := range part {
					id := ids.Next(time.Now())
					if err := bk.Put(id[:], v); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
