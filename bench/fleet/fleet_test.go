package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The workload: runs of stepsPerRun steps, each step a replyBytes model
// reply holding an action, then an obsBytes observation; no model delay.
const (
	stepsPerRun = 50
	replyBytes  = 2048
	obsBytes    = 4096
)

// poolConns is the connection pool of every contender, whatever the
// number of runs: pgstore.Options.MaxConns for PolyLoop, pgx's pool for
// the floors, pool_max_conns for DBOS (whose own default is 20).
// pgstore holds a run by a lease on its row, not by a connection, so all
// 64 runs drive at once in a pool of 16.
const poolConns = 16

// BenchmarkFleet: step throughput (steps/s; one op is one step) of 1 and
// 64 concurrent runs of stepsPerRun steps on one PostgreSQL server with
// fsync on, for PolyLoop (engine.Run on a pgstore.Store), DBOS Transact Go
// (a workflow of two steps per PolyLoop step, returning the step's reply
// and observation), and the raw floor (plain pgx inserting the rows
// PolyLoop writes, each run committing its own, or every queued run's rows
// in one transaction). README.md says what each name measures.
func BenchmarkFleet(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			b.Run("floor-ungrouped", func(b *testing.B) { benchFloor(b, pgtest.DurableDSN(b), n, false) })
			b.Run("floor-grouped", func(b *testing.B) { benchFloor(b, pgtest.DurableDSN(b), n, true) })
			b.Run("polyloop", func(b *testing.B) { benchPolyloop(b, pgtest.DurableDSN(b), n) })
			b.Run("dbos", func(b *testing.B) { benchDBOS(b, pgtest.DurableDSN(b), n) })
		})
	}
}

// drive takes b.N steps as runs of up to stepsPerRun steps, n at once: n
// workers each take the next run (its index and number of steps) until
// all b.N steps are taken, and run it. It reports steps/s.
func drive(b *testing.B, n int, run func(index, steps int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for !b.Failed() {
				i := next.Add(1) - 1
				steps := min(int64(b.N)-i*stepsPerRun, stepsPerRun)
				if steps <= 0 {
					return
				}
				if err := run(int(i), int(steps)); err != nil {
					b.Errorf("run %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
}

// texts are the workload's payloads: per step index, the model's reply
// ("ACTION: " and a window of text, replyBytes in all) and the
// observation (obsBytes). Each is a window of this repository's own
// documentation and Go source at an offset drawn from the step index, as
// the engine's storage benchmarks cut them: text that compresses like
// text, not noise or a repeated phrase.
type texts struct {
	replies, observations [stepsPerRun]string
}

// workloadTexts cuts the texts once; it fails when the repository's text
// is not where a test in bench/fleet finds it.
var workloadTexts = sync.OnceValues(func() (*texts, error) {
	var corpus strings.Builder
	for _, pattern := range []string{"../../README.md", "../../BENCHMARKS.md", "../../*/doc.go", "../../engine/*.go", "../../kv/*.go"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil {
				corpus.Write(data)
			}
		}
	}
	c := corpus.String()
	if len(c) < 16*obsBytes {
		return nil, fmt.Errorf("the repository's text (README.md, engine/*.go ... two directories up) holds %d bytes, fewer than the %d the payloads are cut from: run the benchmarks in bench/fleet of a PolyLoop tree", len(c), 16*obsBytes)
	}
	window := func(rng *rand.Rand, n int) string {
		at := rng.IntN(len(c) - n)
		return c[at : at+n]
	}
	t := &texts{}
	for k := range stepsPerRun {
		t.replies[k] = "ACTION: " + window(rand.New(rand.NewPCG(uint64(k), 1)), replyBytes-len("ACTION: "))
		t.observations[k] = window(rand.New(rand.NewPCG(uint64(k), 2)), obsBytes)
	}
	return t, nil
})

func workload(tb testing.TB) *texts {
	tb.Helper()
	t, err := workloadTexts()
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// fleetModel answers call k < steps with the workload's reply k (an
// action), and call steps with a final answer, at once.
type fleetModel struct {
	steps int
	t     *texts
}

func (m fleetModel) Call(_ context.Context, c seams.ModelCall) (events.ModelReply, error) {
	if c.CallIndex >= m.steps {
		return events.ModelReply{CallID: "call-final", Content: "FINAL: done"}, nil
	}
	return events.ModelReply{CallID: fmt.Sprint("call-", c.CallIndex), Content: m.t.replies[c.CallIndex]}, nil
}
func (fleetModel) Parameters() map[string]string { return nil }

// fleetExecutor observes the workload's observation for each step.
type fleetExecutor struct{ t *texts }

func (e fleetExecutor) Execute(_ context.Context, c seams.ActionCall) (events.ActionOutcome, error) {
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: e.t.observations[c.StepIdx]}, nil
}
func (fleetExecutor) Parameters() map[string]string { return nil }

// polyloopRun runs one run of steps action steps and its final answer on
// store, and checks that it ended so.
func polyloopRun(store seams.RunStore, t *texts, runID string, steps int) error {
	def := engine.Definition{Model: fleetModel{steps: steps, t: t}, Parser: seamstest.Parser{}, Store: store}
	req := engine.Request{RunID: runID, Executor: fleetExecutor{t: t}, ModelReplayPolicy: events.ReplaySafe,
		Budget:  engine.Budget{MaxSteps: steps + 1, MaxActions: steps + 1, MaxConsecutiveParseFailures: 1, MaxPromptChars: 1 << 30},
		Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "work through the repository")}}}
	r, err := engine.Run(context.Background(), def, req)
	if err != nil {
		return err
	}
	if r.StopReason != events.StopAgentFinished || len(r.Steps) != steps+1 {
		return fmt.Errorf("run %s stopped %s after %d steps, want %s after %d", runID, r.StopReason, len(r.Steps), events.StopAgentFinished, steps+1)
	}
	return nil
}

// openStore opens a PolyLoop store in a fresh schema of dsn's server with
// a pool of conns.
func openStore(tb testing.TB, dsn string, conns int32) *pgstore.Store {
	tb.Helper()
	store, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Schema: pgtest.Schema(tb), MaxConns: conns})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { store.Close() })
	return store
}

func benchPolyloop(b *testing.B, dsn string, n int) {
	t := workload(b)
	store := openStore(b, dsn, poolConns)
	drive(b, n, func(i, steps int) error { return polyloopRun(store, t, fmt.Sprint("run-", i), steps) })
}

// fleetWorkflow is DBOS's run: per step, a step returning the reply, then
// a step returning the observation (DBOS checkpoints each step's result in
// its own transaction). It returns the bytes the steps returned.
func fleetWorkflow(ctx dbos.Context, steps int) (int, error) {
	t, err := workloadTexts()
	if err != nil {
		return 0, err
	}
	total := 0
	for k := range steps {
		reply, err := dbos.RunAsStep(ctx, func(context.Context) (string, error) { return t.replies[k], nil }, dbos.WithStepName("reply"))
		if err != nil {
			return total, err
		}
		obs, err := dbos.RunAsStep(ctx, func(context.Context) (string, error) { return t.observations[k], nil }, dbos.WithStepName("observation"))
		if err != nil {
			return total, err
		}
		total += len(reply) + len(obs)
	}
	return total, nil
}

// launchDBOS launches DBOS with its system tables in a fresh schema of
// dsn's database, a pool of conns, and fleetWorkflow registered; it is
// shut down when tb ends.
func launchDBOS(tb testing.TB, dsn string, conns int32) dbos.Context {
	tb.Helper()
	dsn, err := withPoolMaxConns(dsn, conns)
	if err != nil {
		tb.Fatal(err)
	}
	log := &shutdownQuiet{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), shut: &atomic.Bool{}}
	ctx, err := dbos.NewContext(context.Background(), dbos.Config{
		AppName:        "polyloop-fleet-bench",
		DatabaseURL:    dsn,
		DatabaseSchema: pgtest.Schema(tb),
		Logger:         slog.New(log),
	})
	if err != nil {
		tb.Fatal(err)
	}
	dbos.RegisterWorkflow(ctx, fleetWorkflow)
	if err := dbos.Launch(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		log.shut.Store(true)
		dbos.Shutdown(ctx, 10*time.Second)
	})
	return ctx
}

// shutdownQuiet is DBOS's logger: warnings and errors (at info level it
// logs every launch), until its shutdown starts, when its background
// loops log their cancelled contexts as errors.
type shutdownQuiet struct {
	slog.Handler
	shut *atomic.Bool
}

func (h *shutdownQuiet) Enabled(ctx context.Context, l slog.Level) bool {
	return !h.shut.Load() && h.Handler.Enabled(ctx, l)
}

func (h *shutdownQuiet) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &shutdownQuiet{Handler: h.Handler.WithAttrs(attrs), shut: h.shut}
}

func (h *shutdownQuiet) WithGroup(name string) slog.Handler {
	return &shutdownQuiet{Handler: h.Handler.WithGroup(name), shut: h.shut}
}

// withPoolMaxConns sets pool_max_conns in dsn, a URL or a keyword/value
// string (DBOS defaults its pool to 20 connections otherwise).
func withPoolMaxConns(dsn string, conns int32) (string, error) {
	if !strings.Contains(dsn, "://") {
		return fmt.Sprintf("%s pool_max_conns=%d", dsn, conns), nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("the server's DSN is not a URL: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", fmt.Sprint(conns))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// dbosRun runs fleetWorkflow for steps steps and checks what it returned.
func dbosRun(ctx dbos.Context, steps int) error {
	h, err := dbos.RunWorkflow(ctx, fleetWorkflow, steps)
	if err != nil {
		return err
	}
	got, err := h.GetResult()
	if err != nil {
		return err
	}
	if want := steps * (replyBytes + obsBytes); got != want {
		return fmt.Errorf("workflow %s returned %d bytes of step results, want %d", h.GetWorkflowID(), got, want)
	}
	return nil
}

func benchDBOS(b *testing.B, dsn string, n int) {
	workload(b)
	ctx := launchDBOS(b, dsn, poolConns)
	drive(b, n, func(_, steps int) error { return dbosRun(ctx, steps) })
}

// floorTx is one transaction's rows as PolyLoop's store writes them: kind,
// value (events.Marshal's bytes, sealed) and crc per event.
type floorTx struct {
	kinds  []string
	values [][]byte
	crcs   []int64
}

// recorder is a store that records every append's events.
type recorder struct {
	seamstest.MemStore
	mu      sync.Mutex
	appends [][]events.Event
}

func (r *recorder) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	envs, err := r.MemStore.Append(ctx, runID, after, evs...)
	if err == nil {
		r.mu.Lock()
		r.appends = append(r.appends, slices.Clone(evs))
		r.mu.Unlock()
	}
	return envs, err
}

// floorRuns caches floorRun's answers by number of steps.
var floorRuns sync.Map // int -> []floorTx

// floorRun is what PolyLoop appends for a run of steps steps, transaction
// by transaction: the run recorded on an in-memory store, each event
// encoded as pgstore encodes it (events.Marshal, sealed).
func floorRun(tb testing.TB, t *texts, steps int) []floorTx {
	tb.Helper()
	if txs, ok := floorRuns.Load(steps); ok {
		return txs.([]floorTx)
	}
	rec := &recorder{}
	if err := polyloopRun(rec, t, "floor", steps); err != nil {
		tb.Fatal(err)
	}
	var ids events.IDSource
	txs := make([]floorTx, len(rec.appends))
	for i, evs := range rec.appends {
		for _, ev := range evs {
			v, err := events.Marshal(ev)
			if err != nil {
				tb.Fatal(err)
			}
			if err := events.Seal(v, "floor", ids.Next(time.Now())); err != nil {
				tb.Fatal(err)
			}
			sum, _ := events.SealedChecksum(v)
			txs[i].kinds = append(txs[i].kinds, string(ev.Kind()))
			txs[i].values = append(txs[i].values, v)
			txs[i].crcs = append(txs[i].crcs, int64(sum))
		}
	}
	floorRuns.Store(steps, txs)
	return txs
}

// rows are rows of the floor's table, column by column.
type rows struct {
	runIDs []string
	seqs   []int64
	ids    [][]byte
	kinds  []string
	values [][]byte
	crcs   []int64
}

func (r *rows) add(o *rows) {
	r.runIDs = append(r.runIDs, o.runIDs...)
	r.seqs = append(r.seqs, o.seqs...)
	r.ids = append(r.ids, o.ids...)
	r.kinds = append(r.kinds, o.kinds...)
	r.values = append(r.values, o.values...)
	r.crcs = append(r.crcs, o.crcs...)
}

// floor is the raw pgx floor: a table shaped and stored like the store's events (values
// kept inline up to a page, not compressed again by PostgreSQL), and
// its insert.
type floor struct {
	pool   *pgxpool.Pool
	table  pgx.Identifier
	insert string
	ids    events.IDSource
	// queue feeds the grouping committer; nil: each run commits its own.
	queue chan *pending
}

// pending is a run's transaction waiting for the grouping committer.
type pending struct {
	rows *rows
	done chan error
}

// newFloor creates the floor's table in a fresh schema of dsn's server,
// with a pool of conns; grouped starts the committer that puts the rows of
// every run queued at the moment in one transaction.
func newFloor(tb testing.TB, dsn string, conns int32, grouped bool) *floor {
	tb.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	f := &floor{pool: pool, table: pgx.Identifier{pgtest.Schema(tb), "events"}}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{f.table[0]}.Sanitize()+`;
CREATE TABLE `+f.table.Sanitize()+` (run_id text, seq bigint, id bytea, kind text, value bytea, crc bigint, PRIMARY KEY (run_id, seq)) WITH (toast_tuple_target = 8160);
ALTER TABLE `+f.table.Sanitize()+` ALTER COLUMN value SET STORAGE EXTERNAL`); err != nil {
		tb.Fatal(err)
	}
	f.insert = `INSERT INTO ` + f.table.Sanitize() + ` (run_id, seq, id, kind, value, crc)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::bytea[], $6::bigint[])`
	if grouped {
		f.queue = make(chan *pending, 1024)
		stopped := make(chan struct{})
		go f.group(stopped)
		tb.Cleanup(func() { close(f.queue); <-stopped })
	}
	return f
}

// exec inserts r in one transaction (one autocommit statement).
func (f *floor) exec(r *rows) error {
	_, err := f.pool.Exec(context.Background(), f.insert, r.runIDs, r.seqs, r.ids, r.kinds, r.values, r.crcs)
	return err
}

// group is the grouping committer: it takes every transaction queued at
// the moment, inserts all their rows in one transaction, and answers each.
func (f *floor) group(stopped chan<- struct{}) {
	defer close(stopped)
	for p := range f.queue {
		batch := []*pending{p}
	more:
		for {
			select {
			case q, ok := <-f.queue:
				if !ok {
					break more
				}
				batch = append(batch, q)
			default:
				break more
			}
		}
		all := &rows{}
		for _, q := range batch {
			all.add(q.rows)
		}
		err := f.exec(all)
		for _, q := range batch {
			q.done <- err
		}
	}
}

// run writes a run's transactions (floorRun's) as runID, one after
// another, each committed alone or in a group.
func (f *floor) run(txs []floorTx, runID string) error {
	seq := int64(0)
	for _, tx := range txs {
		r := &rows{kinds: tx.kinds, values: tx.values, crcs: tx.crcs}
		for range tx.values {
			seq++
			id := f.ids.Next(time.Now())
			r.runIDs, r.seqs, r.ids = append(r.runIDs, runID), append(r.seqs, seq), append(r.ids, id[:])
		}
		if f.queue == nil {
			if err := f.exec(r); err != nil {
				return err
			}
			continue
		}
		p := &pending{rows: r, done: make(chan error, 1)}
		f.queue <- p
		if err := <-p.done; err != nil {
			return err
		}
	}
	return nil
}

func benchFloor(b *testing.B, dsn string, n int, grouped bool) {
	t := workload(b)
	// The rows of the runs this b.N takes, recorded before the clock runs:
	// full runs and at most one shorter one.
	full, short := floorRun(b, t, stepsPerRun), []floorTx(nil)
	if rest := b.N % stepsPerRun; rest != 0 {
		short = floorRun(b, t, rest)
	}
	f := newFloor(b, dsn, poolConns, grouped)
	drive(b, n, func(i, steps int) error {
		if steps < stepsPerRun {
			return f.run(short, fmt.Sprint("run-", i))
		}
		return f.run(full, fmt.Sprint("run-", i))
	})
}

// TestFleetWorkloads: each contender does the work its benchmark claims,
// on a short run. PolyLoop's run finishes with its steps; the floor writes
// exactly as many rows as PolyLoop's store holds for the same run, both
// ungrouped and grouped from concurrent runs, each run's rows numbered
// 1..n without a gap; DBOS's workflow returns every step's reply and
// observation.
func TestFleetWorkloads(t *testing.T) {
	const steps, runs = 3, 4
	dsn := pgtest.DSN(t)
	texts := workload(t)

	store := openStore(t, dsn, runs+4)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			if err := polyloopRun(store, texts, fmt.Sprint("run-", i), steps); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	infos, err := store.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != runs {
		t.Fatalf("PolyLoop's store holds %d runs, want %d", len(infos), runs)
	}
	stored := infos[0].Events
	txs, written := floorRun(t, texts, steps), 0
	for _, tx := range txs {
		written += len(tx.values)
	}
	if written != stored {
		t.Fatalf("the floor writes %d rows for a run of %d steps, PolyLoop's store %d", written, steps, stored)
	}

	for _, grouped := range []bool{false, true} {
		f := newFloor(t, dsn, runs+4, grouped)
		for i := range runs {
			wg.Go(func() {
				if err := f.run(txs, fmt.Sprint("run-", i)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var nruns, bad int
		err := f.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE n <> $1 OR lo <> 1 OR hi <> $1)
FROM (SELECT run_id, count(*) AS n, min(seq) AS lo, max(seq) AS hi FROM `+f.table.Sanitize()+` GROUP BY run_id) r`, stored).Scan(&nruns, &bad)
		if err != nil {
			t.Fatal(err)
		}
		if nruns != runs || bad != 0 {
			t.Errorf("grouped=%v: the floor's table holds %d runs (want %d), %d of them not rows 1..%d", grouped, nruns, runs, bad, stored)
		}
	}

	ctx := launchDBOS(t, dsn, runs+4)
	for range runs {
		wg.Go(func() {
			if err := dbosRun(ctx, steps); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestPoolMaxConns: DBOS's pool size goes into either form of DSN.
func TestPoolMaxConns(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://u:p@/db?host=%2Ftmp%2Fx&sslmode=disable", "postgres://u:p@/db?host=%2Ftmp%2Fx&pool_max_conns=7&sslmode=disable"},
		{"postgres://u@h/db?pool_max_conns=20", "postgres://u@h/db?pool_max_conns=7"},
		{"host=/tmp/x dbname=db", "host=/tmp/x dbname=db pool_max_conns=7"},
	} {
		got, err := withPoolMaxConns(c.dsn, 7)
		if err != nil || got != c.want {
			t.Errorf("withPoolMaxConns(%q) = %q, %v; want %q", c.dsn, got, err, c.want)
		}
	}
	if _, err := withPoolMaxConns("postgres://u@h:port/db", 7); err == nil {
		t.Error("withPoolMaxConns accepted a URL that does not parse")
	}
}
