package engine_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestMain(m *testing.M) {
	if os.Getenv(rssChildEnv) != "" {
		os.Exit(rssChild())
	}
	os.Exit(pgtest.Main(m))
}

// openPG opens a store in a fresh schema of the benchmarks' durable server
// (fsync on), with room for conns connections.
func openPG(b *testing.B, conns int32) (*pgstore.Store, string) {
	dsn := pgtest.DurableDSN(b)
	s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Schema: pgtest.Schema(b), MaxConns: conns})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s, dsn
}

// BenchmarkPostgresStepLatency: one run's durable step on PostgreSQL
// against the floor of two plain pgx transactions inserting the same bytes
// (one autocommit INSERT of the group's rows each, into a table shaped like
// the store's, without its index row or checks). Target: ≤ 1.3×.
func BenchmarkPostgresStepLatency(b *testing.B) {
	b.Run("floor", func(b *testing.B) {
		step := pgFloor(b, 4)
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			step(0, i)
		}
	})
	b.Run("polyloop", func(b *testing.B) {
		store, _ := openPG(b, 4)
		def := engine.Definition{Model: benchModel{steps: b.N}, Parser: seamstest.Parser{}, Store: store}
		b.ResetTimer()
		r, err := engine.Run(context.Background(), def, benchRequest("bench", b.N))
		if err != nil || len(r.Steps) != b.N+1 {
			b.Fatalf("%v after %d steps: %v", r.StopReason, len(r.Steps), err)
		}
	})
}

// BenchmarkPostgresConcurrentRuns: step throughput of N runs on one
// PostgreSQL store (fsync on; its appends grouped), a pool of 16
// connections whatever N. Compare runs=64 with runs=1 (target ≥ 6× the
// throughput). The floor is N goroutines committing the floor's two
// transactions per step, each its own: what this machine's server does at
// that concurrency with the same bytes, ungrouped.
func BenchmarkPostgresConcurrentRuns(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("runs=%d/floor", n), func(b *testing.B) {
			step := pgFloor(b, int32(n)+4)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := range n {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						step(w, int(i))
					}
				})
			}
			wg.Wait()
		})
		b.Run(fmt.Sprintf("runs=%d/polyloop", n), func(b *testing.B) {
			store, _ := openPG(b, 16)
			concurrentRuns(b, n, store, false)
		})
	}
}

// pgFloor prepares the floor: a table shaped and stored like the store's events (values
// kept inline up to a page, not compressed again by PostgreSQL), and
// a function committing one step's two groups of values as two plain
// autocommit INSERTs from worker w (its own run id), step i.
func pgFloor(b *testing.B, conns int32) func(w, i int) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.DurableDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	table := pgx.Identifier{pgtest.Schema(b), "floor"}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{table[0]}.Sanitize()+`;
CREATE TABLE `+table.Sanitize()+` (run_id text, seq bigint, id bytea, kind text, value bytea, crc bigint, PRIMARY KEY (run_id, seq)) WITH (toast_tuple_target = 8160);
ALTER TABLE `+table.Sanitize()+` ALTER COLUMN value SET STORAGE EXTERNAL`); err != nil {
		b.Fatal(err)
	}
	insert := `INSERT INTO ` + table.Sanitize() + ` (run_id, seq, id, kind, value, crc)
SELECT $1, $2 + t.ord, t.id, t.kind, t.value, t.crc FROM unnest($3::bytea[], $4::text[], $5::bytea[], $6::bigint[]) WITH ORDINALITY AS t(id, kind, value, crc, ord)`
	groups := stepEvents(b)
	var ids events.IDSource
	return func(w, i int) {
		run := fmt.Sprintf("w%d", w)
		for gi, g := range groups {
			rowIDs, kinds, crcs := make([][]byte, len(g)), make([]string, len(g)), make([]int64, len(g))
			for j := range g {
				id := ids.Next(time.Now())
				rowIDs[j], kinds[j] = id[:], "event"
			}
			if _, err := pool.Exec(ctx, insert, run, i*4+gi*2, rowIDs, kinds, g, crcs); err != nil {
				b.Fatal(err)
			}
		}
	}
}
