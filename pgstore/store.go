package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// DefaultSchema is the schema a store's tables live in unless
// Options.Schema names another.
const DefaultSchema = "polyloop"

// SchemaParam is the DSN parameter naming the store's schema
// (postgres://host/db?polyloop_schema=agents) when Options.Schema is empty.
const SchemaParam = "polyloop_schema"

// DefaultConnectTimeout bounds connecting to the server (each connection
// of the pool), unless Options.ConnectTimeout or the DSN's connect_timeout
// says otherwise.
const DefaultConnectTimeout = 10 * time.Second

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN-1): longer
// names are cut silently.
const maxIdentifier = 63

// DefaultMaxConns is the pool size unless Options.MaxConns or the DSN's
// pool_max_conns says otherwise.
const DefaultMaxConns = 32

// Errors. Test with errors.Is.
var (
	// ErrReadOnly: Append on a store opened with ReadOnly.
	ErrReadOnly = errors.New("pgstore: store is open read-only")
	// ErrSchemaVersion: the database's PolyLoop schema is at another
	// version than this package's (newer, or older and the store is
	// read-only).
	ErrSchemaVersion = errors.New("pgstore: schema version mismatch")
	// ErrCorrupt wraps every damage Load and Runs find.
	ErrCorrupt = errors.New("pgstore: store is corrupt")
)

// Options configure Open.
type Options struct {
	// Schema is the PostgreSQL schema holding the store's tables (the DSN's
	// polyloop_schema parameter, else DefaultSchema, when empty). One
	// database can hold several stores.
	Schema string
	// ConnectTimeout bounds each connection attempt (DefaultConnectTimeout
	// when zero and the DSN sets no connect_timeout).
	ConnectTimeout time.Duration
	// ReadOnly opens the store for reading: no migration, every statement in
	// a read-only transaction, Append fails with ErrReadOnly. Readers
	// (polyloop-inspect) use it while agents write.
	ReadOnly bool
	// MaxConns bounds the connection pool: zero means the DSN's
	// pool_max_conns, else DefaultMaxConns. A run driven by this process
	// holds one connection (LockRun), so this bounds the runs it drives at
	// once; keep it below the server's max_connections divided by the
	// number of worker processes.
	MaxConns int32
}

// Store is a seams.RunStore (and seams.RunReader) on PostgreSQL. Share one
// Store between all runs of a process; Close it when done.
type Store struct {
	pool     *pgxpool.Pool
	schema   string
	target   string // host, port, database and user, for errors
	readOnly bool
	ids      events.IDSource
	clock    func() time.Time // time.Now; a test hook
	q        queries

	connectTimeout time.Duration
	lockMu         sync.Mutex
	locks          map[string]*runLock // runs this process reserved (LockRun)
}

// queries are the statements, with the schema filled in.
type queries struct {
	start, cont, state, load, runs, delete string
	runsTable                              string
}

// Open connects to the database dsn names (a postgres:// URL or a
// key=value string, as libpq takes them), applies the store's migrations
// unless ReadOnly (Migrate), and checks the schema version. It fails within
// the connect timeout with an error naming the host when the server cannot
// be reached, and with a clear error for wrong credentials or a missing
// database.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err)
	}
	if sch, ok := cfg.ConnConfig.RuntimeParams[SchemaParam]; ok {
		delete(cfg.ConnConfig.RuntimeParams, SchemaParam) // ours, not the server's
		if o.Schema == "" {
			o.Schema = sch
		}
	}
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if len(o.Schema) > maxIdentifier {
		return nil, fmt.Errorf("pgstore: schema name %q is %d bytes; PostgreSQL keeps only %d, so two names could share one schema", o.Schema, len(o.Schema), maxIdentifier)
	}
	if o.ConnectTimeout > 0 || cfg.ConnConfig.ConnectTimeout == 0 {
		t := o.ConnectTimeout
		if t == 0 {
			t = DefaultConnectTimeout
		}
		cfg.ConnConfig.ConnectTimeout = t
	}
	switch {
	case o.MaxConns > 0:
		cfg.MaxConns = o.MaxConns
	case !strings.Contains(dsn, "pool_max_conns"):
		cfg.MaxConns = DefaultMaxConns
	}
	rt := cfg.ConnConfig.RuntimeParams
	// Durable on commit whatever the server's or role's default says.
	rt["synchronous_commit"] = "on"
	if o.ReadOnly {
		rt["default_transaction_read_only"] = "on"
	}
	if rt["application_name"] == "" {
		rt["application_name"] = "polyloop"
	}
	s := &Store{
		schema:   o.Schema,
		target:   describe(cfg.ConnConfig),
		readOnly: o.ReadOnly,
		clock:    time.Now,
		q:        newQueries(pgx.Identifier{o.Schema}.Sanitize()),

		connectTimeout: cfg.ConnConfig.ConnectTimeout,
		locks:          map[string]*runLock{},
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", s.target, scrub(err))
	}
	pingCtx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout)
	defer cancel()
	if err := s.pool.Ping(pingCtx); err != nil {
		s.pool.Close()
		return nil, s.connectError(err, cfg.ConnConfig.ConnectTimeout)
	}
	if o.ReadOnly {
		err = s.checkVersion(ctx)
	} else {
		err = s.Migrate(ctx)
	}
	if err != nil {
		s.pool.Close()
		return nil, err
	}
	return s, nil
}

// describe names a connection target without its password.
func describe(c *pgx.ConnConfig) string {
	return fmt.Sprintf("host=%s port=%d database=%s user=%s", c.Host, c.Port, c.Database, c.User)
}

// connectError explains a failed first connection on one line, leading
// with its cause.
func (s *Store) connectError(err error, timeout time.Duration) error {
	why := cause(err)
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01", "28000":
			return &oneLine{fmt.Sprintf("pgstore: %s: authentication failed (wrong user or password): %s", s.target, why), err}
		case "3D000":
			return &oneLine{fmt.Sprintf("pgstore: %s: the database does not exist: %s", s.target, why), err}
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return &oneLine{fmt.Sprintf("pgstore: %s: no answer from the server within the %v connect timeout: %s", s.target, timeout, why), err}
	}
	return &oneLine{fmt.Sprintf("pgstore: cannot connect to %s: %s", s.target, why), err}
}

// oneLine is an error whose message is rewritten on one line; the error
// it explains stays reachable for errors.Is and errors.As.
type oneLine struct {
	msg string
	err error
}

func (e *oneLine) Error() string { return e.msg }
func (e *oneLine) Unwrap() error { return e.err }

// cause is the most specific reason a connection failed, on one line.
// pgx's *pgconn.ConnectError lists every attempt it made (each address of
// each host, with TLS and then without), one per line, in the order made:
// a server that refuses TLS puts "tls error: server refused TLS connection"
// first even when the attempt without TLS was answered with the real
// reason. The server's own error (a *pgconn.PgError: a missing database,
// wrong credentials) is that reason when there is one; otherwise each
// attempt's reason is given once, joined by "; ".
func cause(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return scrubText(pe.Error())
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		err = ce.Unwrap() // without pgx's "failed to connect to `user=… database=…`:", which the caller says better
	}
	var reasons []string
	var collect func(error)
	collect = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				collect(e)
			}
			return
		}
		reasons = append(reasons, strings.Split(err.Error(), "\n")...)
	}
	collect(err)
	var out []string
	for i, r := range reasons {
		r = strings.TrimSpace(r)
		// A reason repeated, or said within another, is said once.
		said := r == ""
		for j, o := range reasons {
			if j != i && strings.Contains(o, r) && (len(o) > len(r) || j < i) {
				said = true
			}
		}
		if !said {
			out = append(out, r)
		}
	}
	return scrubText(strings.Join(out, "; "))
}

// parseError says why a connection string does not parse without quoting
// it: pgx's error quotes the string with its passwords masked, but only as
// far as it can tell them apart, which in a malformed string is not always.
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return fmt.Errorf("pgstore: the connection string does not parse: %w", scrub(err))
	}
	// pgx's message is "cannot parse `<the string, masked>`: <why>".
	quoted := pgconn.NewParseConfigError(pe.ConnString, "", nil).Error()
	why, ok := strings.CutPrefix(pe.Error(), quoted)
	if !ok {
		why = "(pgx's reason withheld: it quotes the string)"
	}
	return fmt.Errorf("pgstore: the connection string does not parse: %s", why)
}

// scrub drops a password pgx may quote from a connection string.
func scrub(err error) error {
	if msg := scrubText(err.Error()); msg != err.Error() {
		return &oneLine{msg, err}
	}
	return err
}

// scrubText is scrub for a message.
func scrubText(msg string) string {
	if i := strings.Index(msg, "password="); i >= 0 {
		j := strings.IndexAny(msg[i:], " `'\"")
		if j < 0 {
			j = len(msg) - i
		}
		return msg[:i] + "password=xxxxx" + msg[i+j:]
	}
	return msg
}

func newQueries(schema string) queries {
	sub := strings.NewReplacer("{{schema}}", schema).Replace
	// The rows an append writes: the batch's events, numbered after the
	// stream's base (its length before the append).
	insertEvents := `
INSERT INTO {{schema}}.events (run_id, seq, id, kind, value, crc)
SELECT $1, r.base + t.ord, t.id, t.kind, t.value, t.crc
FROM r, unnest($2::bytea[], $3::text[], $4::bytea[], $5::bigint[]) WITH ORDINALITY AS t(id, kind, value, crc, ord)`
	return queries{
		// A new run: its index row, unless one exists (then no row, and
		// nothing is written: of two concurrent starts one waits for the
		// other's commit and writes nothing).
		start: sub(`WITH r AS (
	INSERT INTO {{schema}}.runs (run_id, status, steps, events, stop_reason, first_event, last_event, last_id)
	VALUES ($1, $6, $7, $8, $9, $12, $10, $11)
	ON CONFLICT (run_id) DO NOTHING
	RETURNING 0::bigint AS base)` + insertEvents),
		// A continued run: its index row moves on only when the stream's
		// last key is the caller's tail ($12) and the run is not finished;
		// a concurrent continuation waits for the row lock, then finds
		// another last key and writes nothing.
		cont: sub(`WITH r AS (
	UPDATE {{schema}}.runs SET status = $6, steps = steps + $7, events = events + $8,
		stop_reason = $9, last_event = $10, last_id = $11
	WHERE run_id = $1 AND last_id = $12 AND status = 'running'
	RETURNING events - $8 AS base)` + insertEvents),
		state: sub(`SELECT last_id, status FROM {{schema}}.runs WHERE run_id = $1`),
		// One row at least: the index row's anchors (null without one) and
		// the events in order (null without any).
		load: sub(`SELECT r.events, r.last_id, e.seq, e.id, e.kind, e.value, e.crc
FROM (SELECT $1::text AS run_id) k
LEFT JOIN {{schema}}.runs r ON r.run_id = k.run_id
LEFT JOIN {{schema}}.events e ON e.run_id = k.run_id
ORDER BY e.seq`),
		runs: sub(`SELECT run_id, status, steps, events, stop_reason, first_event, last_event, last_id
FROM {{schema}}.runs ORDER BY run_id COLLATE "C"`),
		// A run's index row when finished (or forced), then its events when
		// the row went (or forced: events without a row are damage).
		delete: sub(`WITH r AS (DELETE FROM {{schema}}.runs WHERE run_id = $1 AND (status = 'finished' OR $2) RETURNING 1),
e AS (DELETE FROM {{schema}}.events WHERE run_id = $1 AND (EXISTS (SELECT 1 FROM r) OR $2) RETURNING 1)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM e)`),
		runsTable: sub(`{{schema}}.runs`),
	}
}

// Schema is the PostgreSQL schema holding the store's tables.
func (s *Store) Schema() string { return s.schema }

// Parameters implements seams.RunStore, as kv does: the store's kind and
// the wire version of the events it writes.
func (s *Store) Parameters() map[string]string {
	return map[string]string{"kind": "postgres", "schema_version": events.CurrentSchemaVersion}
}

// Append implements seams.RunStore in one statement, so one transaction,
// durable on commit: the batch's events and the run's index row. The
// append rules are seams.CheckAppend's, and the database enforces the
// tail: the index row moves on only from the tail the caller names.
func (s *Store) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: append: %w", err)
	}
	// The batch must be valid continuing the stream the caller saw; the
	// database then checks that the stream is what the caller saw.
	if err := seams.CheckAppend(runID, after, false, after, evs); err != nil {
		return nil, s.refusal(ctx, runID, after, evs, err)
	}
	n := len(evs)
	ids, kinds, vals, crcs := make([][]byte, n), make([]string, n), make([][]byte, n), make([]int64, n)
	envs := make([]events.Envelope, n)
	info := seams.RunInfo{Status: seams.StatusRunning}
	if after == maxULID {
		return nil, s.refusal(ctx, runID, after, evs, nil) // no key follows it; it is not a real tail
	}
	now, tail := s.clock(), after
	for i, ev := range evs {
		v, err := events.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("pgstore: append to %q: event %d (%s): %w", runID, i, ev.Kind(), err)
		}
		tail = s.ids.NextAfter(now, tail)
		if err := events.Seal(v, runID, tail); err != nil {
			return nil, err
		}
		sum, _ := events.SealedChecksum(v)
		id := tail
		ids[i], kinds[i], vals[i], crcs[i] = id[:], string(ev.Kind()), v, int64(sum)
		envs[i] = events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		info.Observe(envs[i])
	}
	q, args := s.q.cont, []any{runID, ids, kinds, vals, crcs,
		string(info.Status), info.Steps, info.Events, string(info.StopReason), info.LastEvent, info.LastID[:], after[:]}
	if after == (ulid.ULID{}) {
		q, args[11] = s.q.start, info.FirstEvent
	}
	tag, err := retry(ctx, func() (pgconn.CommandTag, error) {
		w, done := s.sessionFor(runID)
		defer done()
		return w.Exec(ctx, q, args...)
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: append %d events to %q (nothing was written unless the commit's answer was lost; Load tells): %w", n, runID, err)
	}
	if tag.RowsAffected() != int64(n) {
		return nil, s.refusal(ctx, runID, after, evs, nil)
	}
	return envs, nil
}

// maxULID is the largest key; no key can follow it.
var maxULID = ulid.ULID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// refusal explains an append refused against the stream the caller saw
// (rule, nil when the database found the stream moved): it reads the
// stream's real state and applies seams.CheckAppend to it, so every store
// refuses with the same error.
func (s *Store) refusal(ctx context.Context, runID string, after ulid.ULID, evs []events.Event, rule error) error {
	var last []byte
	var status string
	_, err := retry(ctx, func() (struct{}, error) {
		q, done := s.sessionFor(runID)
		defer done()
		return struct{}{}, q.QueryRow(ctx, s.q.state, runID).Scan(&last, &status)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		last, err = make([]byte, 16), nil
	}
	if err != nil {
		if rule != nil {
			return rule
		}
		return fmt.Errorf("pgstore: append to %q was refused and its stream's state could not be read: %w", runID, err)
	}
	if len(last) != 16 {
		return fmt.Errorf("%w: run %q: last_id is %d bytes, not a ULID", ErrCorrupt, runID, len(last))
	}
	if err := seams.CheckAppend(runID, ulid.ULID(last), status == string(seams.StatusFinished), after, evs); err != nil {
		return err
	}
	if rule != nil {
		return rule
	}
	// The stream moved on and back cannot happen (tails only grow); a
	// refusal the rules do not explain is still a refusal.
	return fmt.Errorf("append to %q after %s: %w", runID, after, seams.ErrTailMoved)
}

// Load implements seams.RunStore and seams.RunReader in one statement (one
// snapshot). Every value's checksum is verified, the stored checksum and
// kind columns must agree with the value, sequence numbers must run 1, 2, 3
// without a gap, keys must increase, and the stream must have the length
// and last key its index row names.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", err)
	}
	return retry(ctx, func() ([]events.Envelope, error) { return s.load(ctx, runID, nil) })
}

var _ seams.RunScanner = (*Store)(nil)

// Scan implements seams.RunScanner: Load's query and checks, handing the
// events to fn one at a time as the rows arrive and keeping none. A
// statement the server never received is retried as Load's are, but only
// while fn has been given nothing: a scan is never repeated under it.
func (s *Store) Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error {
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("pgstore: load: %w", err)
	}
	delivered := false
	each := func(env events.Envelope) error {
		delivered = true
		return fn(env)
	}
	for attempt := 1; ; attempt++ {
		_, err := s.load(ctx, runID, each)
		if err == nil || delivered || attempt == 3 || !pgconn.SafeToRetry(err) || ctx.Err() != nil {
			return err
		}
	}
}

// load is Load, or with each set Scan.
func (s *Store) load(ctx context.Context, runID string, each func(events.Envelope) error) ([]events.Envelope, error) {
	q, done := s.sessionFor(runID)
	defer done()
	rows, err := q.Query(ctx, s.q.load, runID)
	if err != nil {
		return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
	}
	defer rows.Close()
	r := events.StreamReader{RunID: runID, Each: each}
	var (
		count   *int64
		anchor  []byte
		seq     *int64
		id      []byte
		kind    *string
		value   []byte
		crc     *int64
		n       int64
		last    ulid.ULID
		indexed bool
	)
	for rows.Next() && !r.Stopped() {
		if err := rows.Scan(&count, &anchor, &seq, &id, &kind, &value, &crc); err != nil {
			return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
		}
		indexed = count != nil
		if seq == nil {
			break // no events
		}
		n++
		if *seq != n {
			r.Problem(fmt.Errorf("event %d is stored as number %d: events are missing or were added", n, *seq))
			n = *seq
		}
		if len(id) != 16 {
			r.Problem(fmt.Errorf("event %d: key %x is not a ULID", *seq, id))
			continue
		}
		key := ulid.ULID(id)
		if key.Compare(last) <= 0 {
			r.Problem(fmt.Errorf("event %d: key %s does not follow %s", *seq, key, last))
		}
		last = key
		if sum, ok := events.SealedChecksum(value); ok && (crc == nil || uint32(*crc) != sum || *crc < 0 || *crc > 1<<32-1) {
			r.Problem(fmt.Errorf("event %d (%s): its crc column disagrees with the value's checksum", *seq, key))
		}
		if env, ok := r.Value(key, value); ok && (kind == nil || *kind != string(env.Kind)) {
			r.Problem(fmt.Errorf("event %d (%s): its kind column says %v, the value is %s", *seq, key, deref(kind), env.Kind))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
	}
	switch {
	case !indexed && n > 0:
		r.Problem(fmt.Errorf("run %q has %d events but no index row", runID, n))
	case indexed:
		if n != *count {
			r.Problem(fmt.Errorf("the stream holds %d events, its index row counts %d: events are missing or were added", n, *count))
		}
		if len(anchor) != 16 || ulid.ULID(anchor) != last {
			r.Problem(fmt.Errorf("the stream's last event is %s, its index row names %x: the tail is missing or was added", last, anchor))
		}
	}
	out, err := r.Stream()
	switch {
	case r.Stopped():
		return nil, err // fn's own error, as it returned it
	case err != nil:
		return out, fmt.Errorf("pgstore: load run %q: %w: %w", runID, ErrCorrupt, err)
	}
	return out, nil
}

func deref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}

// Runs implements seams.RunReader: the index rows, ordered by run id
// (bytewise, as kv orders them). A row whose values break the index's
// rules is listed with StatusDamaged. (Unlike kv, a stream whose index row
// is gone is not listed — finding one would scan every event; Load of such
// a run reports it.)
func (s *Store) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	return retry(ctx, func() ([]seams.RunInfo, error) { return s.runs(ctx) })
}

func (s *Store) runs(ctx context.Context) ([]seams.RunInfo, error) {
	rows, err := s.pool.Query(ctx, s.q.runs)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list runs: %w", err)
	}
	defer rows.Close()
	var out []seams.RunInfo
	for rows.Next() {
		var (
			info         seams.RunInfo
			status, stop string
			last         []byte
			count        int64
		)
		if err := rows.Scan(&info.RunID, &status, &info.Steps, &count, &stop, &info.FirstEvent, &info.LastEvent, &last); err != nil {
			return nil, fmt.Errorf("pgstore: list runs: %w", err)
		}
		info.Status, info.StopReason, info.Events = seams.RunStatus(status), events.StopReason(stop), int(count)
		if len(last) == 16 {
			info.LastID = ulid.ULID(last)
		} else {
			info = seams.RunInfo{RunID: info.RunID, Status: seams.StatusDamaged}
		}
		out = append(out, info)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: list runs: %w", err)
	}
	return out, nil
}

// Close ends the sessions of the runs this process still holds (their
// locks go, and their next appends fail) and closes the pool, waiting for
// other connections in use to be returned.
func (s *Store) Close() error {
	s.endLocks()
	s.pool.Close()
	return nil
}

// retry runs f again, up to three times in all, while it fails in a way
// that guarantees the server received nothing (pgconn.SafeToRetry): a
// pooled connection that died idle (a server restart, a network cut) is
// then replaced by a fresh one instead of failing the caller. A statement
// that may have reached the server is never repeated.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := f()
		if err == nil || attempt == 3 || !pgconn.SafeToRetry(err) || ctx.Err() != nil {
			return v, err
		}
	}
}
