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

// OwnerParam and LeaseParam are DSN parameters setting Options.Owner and
// Options.LeaseDuration (a Go duration: polyloop_lease=10s) when the
// options leave them unset, so commands that take a URL (polyloop-demo,
// polyloop-admin, a worker's flags) can set them.
const (
	OwnerParam = "polyloop_owner"
	LeaseParam = "polyloop_lease"
)

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
	// ErrCorrupt wraps every damage Load and Runs find. It matches
	// events.ErrCorruption, as every layer's damage does.
	ErrCorrupt = events.NewCorruption("pgstore: store is corrupt")
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
	// pool_max_conns, else DefaultMaxConns. A statement holds a connection
	// only while it runs (a run waiting on its model holds none), so a
	// small pool serves thousands of runs; keep it below the server's
	// max_connections divided by the number of worker processes.
	MaxConns int32
	// LeaseDuration is the term of the leases this store takes on the runs
	// it drives (the DSN's polyloop_lease, else DefaultLeaseDuration, when
	// zero): how long after a worker
	// dies, or is cut off from the server, its runs stay refused to the
	// others. At least a second.
	LeaseDuration time.Duration
	// Owner names this worker in the leases it takes, shown to operators
	// as a run's holder (when empty, the DSN's polyloop_owner, else host
	// name and process id). The store adds a random suffix (Store.Owner):
	// two Stores never share leases, even under one name — a whole fleet
	// given one connection string, owner included, is still many workers.
	Owner string
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
	owner          string
	leaseTerm      time.Duration
	leaseMu        sync.Mutex
	leases         map[string]*lease // runs this process holds (LockRun)
	closed         bool              // Close began; guarded by leaseMu
	noRenew        bool              // a test's hung worker; guarded by leaseMu
	group          *grouper          // appends waiting for their transaction
	sendCtx        context.Context   // grouped appends are sent under it
	stopSending    context.CancelFunc
	stop           func()         // Close's: stops the background work
	background     sync.WaitGroup // the lease renewer
}

// queries are the statements, with the schema filled in.
type queries struct {
	start, cont, row, load, runs, deletable, delete, has    string
	prefix                                                  string // a fork's source's events up to one
	take, holder, renew, renewUnlocked, release, releaseAll string
	conts                                                   string // several runs' continuations in one statement
	claim, giveBack, requeue, queued                        string // the queue (queueQueries)
	requestCancel, cancelOf, describe                       string
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
	if v, ok := cfg.ConnConfig.RuntimeParams[OwnerParam]; ok {
		delete(cfg.ConnConfig.RuntimeParams, OwnerParam)
		if o.Owner == "" {
			o.Owner = v
		}
	}
	if v, ok := cfg.ConnConfig.RuntimeParams[LeaseParam]; ok {
		delete(cfg.ConnConfig.RuntimeParams, LeaseParam)
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("pgstore: the connection string's %s=%q is not a duration such as 30s", LeaseParam, v)
		}
		if o.LeaseDuration == 0 {
			o.LeaseDuration = d
		}
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
	// The store's statements are prepared once per connection and their
	// plans do not depend on the values: planning each execution anew
	// (PostgreSQL's custom plans) cost an append 40% of its time.
	rt["plan_cache_mode"] = "force_generic_plan"
	if o.ReadOnly {
		rt["default_transaction_read_only"] = "on"
	}
	if rt["application_name"] == "" {
		rt["application_name"] = "polyloop"
	}
	switch {
	case o.LeaseDuration == 0:
		o.LeaseDuration = DefaultLeaseDuration
	case o.LeaseDuration < time.Second:
		return nil, fmt.Errorf("pgstore: a lease duration of %v is too short to renew over a network: at least 1s", o.LeaseDuration)
	}
	o.Owner = seams.NewOwner(o.Owner)
	s := &Store{
		schema:   o.Schema,
		target:   describe(cfg.ConnConfig),
		readOnly: o.ReadOnly,
		clock:    time.Now,
		q:        newQueries(pgx.Identifier{o.Schema}.Sanitize()),

		connectTimeout: cfg.ConnConfig.ConnectTimeout,
		owner:          o.Owner,
		leaseTerm:      o.LeaseDuration,
		leases:         map[string]*lease{},
		// One group in flight: on the servers measured, two or four
		// smaller groups at once gave half the appends per second.
		group: newGrouper(),
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
	if !o.ReadOnly {
		s.startBackground()
	}
	return s, nil
}

// startBackground starts the lease renewer, which runs until Close, and
// the context grouped appends are sent under, which Close cancels once the
// appends queued have had the connect timeout to go.
func (s *Store) startBackground() {
	s.sendCtx, s.stopSending = context.WithCancel(context.Background())
	renewCtx, stopRenewing := context.WithCancel(context.Background())
	s.stop = func() {
		s.leaseMu.Lock()
		s.closed = true // no run is reserved any more
		s.leaseMu.Unlock()
		// The appends queued are sent (new ones are refused), then the
		// leases given back; past the connect timeout, the statements in
		// flight are cancelled.
		t := time.AfterFunc(s.connectTimeout, s.stopSending)
		s.group.close()
		t.Stop()
		s.releaseAll()
		stopRenewing()
		s.background.Wait()
		s.stopSending()
	}
	s.background.Go(func() { s.renewLeases(renewCtx) })
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
	q := queries{
		// A new run: its index row, unless one exists (then no row, and
		// nothing is written: of two concurrent starts one waits for the
		// other's commit and writes nothing), with the agent it was
		// started for ($16, null for none): queued for that agent's
		// workers unless the append finishes it.
		start: sub(`WITH r AS (
	INSERT INTO {{schema}}.runs (run_id, status, steps, events, stop_reason, first_event, last_event, last_id, crc, lease_owner, lease_expires, agent)
	VALUES ($1, $6, $7, $8, $9, $12, $10, $11, $13, CASE WHEN $6 = 'finished' THEN NULL ELSE $14::text END,
		CASE WHEN $14::text IS NULL OR $6 = 'finished' THEN NULL ELSE now() + $15::bigint * interval '1 microsecond' END, $16::text)
	ON CONFLICT (run_id) DO NOTHING
	RETURNING 0::bigint AS base)` + insertEvents),
		// A continued run: its index row becomes the one the append
		// computed, checksum included, only when it is still exactly the
		// row the writer computed from ($14-$19, the last key its tail
		// $12): a concurrent continuation waits for the row lock, then
		// finds another last key and writes nothing, and a row changed
		// behind the store's back is not written over. A lease holder
		// ($20, the owner) appends only while the lease is its own, and
		// its append renews it for $21 microseconds; an append without a
		// lease ($20 null) only while nobody live holds one. An append
		// finishing the run gives the lease back. Its answer is a row when
		// the run's row moved on (and so every event was inserted), none
		// when it did not: the run's cancel request as the row now holds
		// it.
		cont: sub(`WITH r AS (
	UPDATE {{schema}}.runs SET status = $6, steps = $7, events = $8,
		stop_reason = $9, last_event = $10, last_id = $11, crc = $13,
		lease_owner = CASE WHEN $6 = 'finished' THEN NULL ELSE lease_owner END,
		lease_expires = CASE WHEN $6 = 'finished' THEN NULL WHEN $20::text IS NULL THEN lease_expires
			ELSE now() + $21::bigint * interval '1 microsecond' END
	WHERE run_id = $1 AND last_id = $12 AND status = 'running' AND steps = $14 AND events = $15
		AND stop_reason = $16 AND first_event = $17 AND last_event = $18 AND crc = $19
		AND CASE WHEN $20::text IS NULL THEN lease_owner IS NULL OR lease_expires <= now() ELSE lease_owner = $20::text END
	RETURNING $15::bigint AS base, ` + cancelColumns("") + `),
e AS (` + insertEvents + `)
SELECT cancel_by, cancel_at FROM r`),
		// Several runs' continuations ($1-$16: cont's parameters, a run
		// each; $18-$23: their events, each with its run and its place in
		// its batch), each run's row moved on under cont's conditions and
		// its events inserted only if it was: each run that was (so got
		// every event), and its cancel request.
		conts: sub(`WITH a AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::timestamptz[], $7::bytea[], $8::bigint[],
		$9::bytea[], $10::int[], $11::bigint[], $12::text[], $13::timestamptz[], $14::timestamptz[], $15::bigint[], $16::text[])
	AS a(run_id, status, steps, events, stop_reason, last_event, last_id, crc,
		prev_id, prev_steps, prev_events, prev_stop, prev_first, prev_last, prev_crc, owner)),
r AS (
	UPDATE {{schema}}.runs u SET status = a.status, steps = a.steps, events = a.events,
		stop_reason = a.stop_reason, last_event = a.last_event, last_id = a.last_id, crc = a.crc,
		lease_owner = CASE WHEN a.status = 'finished' THEN NULL ELSE u.lease_owner END,
		lease_expires = CASE WHEN a.status = 'finished' THEN NULL WHEN a.owner IS NULL THEN u.lease_expires
			ELSE now() + $17::bigint * interval '1 microsecond' END
	FROM a
	WHERE u.run_id = a.run_id AND u.last_id = a.prev_id AND u.status = 'running' AND u.steps = a.prev_steps
		AND u.events = a.prev_events AND u.stop_reason = a.prev_stop AND u.first_event = a.prev_first
		AND u.last_event = a.prev_last AND u.crc = a.prev_crc
		AND CASE WHEN a.owner IS NULL THEN u.lease_owner IS NULL OR u.lease_expires <= now() ELSE u.lease_owner = a.owner END
	RETURNING u.run_id, a.prev_events AS base, ` + cancelColumns("u.") + `),
e AS (
	INSERT INTO {{schema}}.events (run_id, seq, id, kind, value, crc)
	SELECT r.run_id, r.base + t.ord, t.id, t.kind, t.value, t.crc
	FROM r JOIN unnest($18::text[], $19::bigint[], $20::bytea[], $21::text[], $22::bytea[], $23::bigint[])
		AS t(run_id, ord, id, kind, value, crc) ON t.run_id = r.run_id)
SELECT run_id, cancel_by, cancel_at FROM r`),
		// A lease ($2 the owner, $3 its term in microseconds) on a run
		// nobody live holds (or that this store holds: one it claimed):
		// the run's cancel request.
		take: sub(`UPDATE {{schema}}.runs SET lease_owner = $2, lease_expires = now() + $3::bigint * interval '1 microsecond'
WHERE run_id = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires <= now())
RETURNING ` + cancelColumns("")),
		// Who holds a run's lease, and whether it is live.
		holder: sub(`SELECT lease_owner, lease_expires, coalesce(lease_expires > now(), false) FROM {{schema}}.runs WHERE run_id = $1`),
		// The leases of runs $1 still held by owner $2, renewed: each such
		// run, true (renewed) and its cancel request.
		renew: sub(`UPDATE {{schema}}.runs SET lease_expires = now() + $3::bigint * interval '1 microsecond'
WHERE run_id = ANY($1::text[]) AND lease_owner = $2 RETURNING run_id, true, ` + cancelColumns("")),
		// The same, skipping the rows another transaction has locked: each
		// run of $1 held by owner $2, whether it was renewed, and its
		// cancel request.
		renewUnlocked: sub(`WITH free AS (
	SELECT run_id FROM {{schema}}.runs WHERE run_id = ANY($1::text[]) AND lease_owner = $2 FOR UPDATE SKIP LOCKED),
up AS (
	UPDATE {{schema}}.runs r SET lease_expires = now() + $3::bigint * interval '1 microsecond'
	FROM free WHERE r.run_id = free.run_id RETURNING r.run_id)
SELECT m.run_id, EXISTS (SELECT 1 FROM up WHERE up.run_id = m.run_id), ` + cancelColumns("m.") + `
FROM {{schema}}.runs m WHERE m.run_id = ANY($1::text[]) AND m.lease_owner = $2`),
		// The lease of run $1 held by owner $2, given back.
		release: sub(`UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL
WHERE run_id = $1 AND lease_owner = $2`),
		// The leases of runs $1 held by owner $2, given back.
		releaseAll: sub(`UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL
WHERE run_id = ANY($1::text[]) AND lease_owner = $2`),
		row: sub(`SELECT ` + rowColumns("") + ` FROM {{schema}}.runs WHERE run_id = $1`),
		// Whether a run has anything stored: two index probes.
		has: sub(`SELECT EXISTS (SELECT 1 FROM {{schema}}.runs WHERE run_id = $1)
	OR EXISTS (SELECT 1 FROM {{schema}}.events WHERE run_id = $1)`),
		// The events in order from number $2 on (1 for all of them), then
		// the index row (its seq null, so last), if any.
		load: sub(`SELECT ` + rowColumns("") + `, NULL::bigint AS seq, NULL::bytea, NULL::text, NULL::bytea, NULL::bigint
FROM {{schema}}.runs WHERE run_id = $1
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, seq, id, kind, value, crc
FROM {{schema}}.events WHERE run_id = $1 AND seq >= $2
ORDER BY seq`),
		// A fork's source's events from its first to number $2, in order.
		prefix: sub(`SELECT seq, id, value FROM {{schema}}.events WHERE run_id = $1 AND seq <= $2 ORDER BY seq`),
		// The index rows with their coordination, and the run ids of
		// events without one (found by a skip scan of the events' primary
		// key: one index probe per run, not a read of every event), every
		// column but run_id null; each with the server's now.
		runs: sub(`SELECT u.*, now() FROM (
	SELECT ` + rowColumns("") + `, ` + coordColumns + ` FROM {{schema}}.runs
	UNION ALL
	SELECT o.run_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, ` + coordNulls + ` FROM (
		WITH RECURSIVE ids(run_id) AS (
			(SELECT run_id FROM {{schema}}.events ORDER BY run_id LIMIT 1)
			UNION ALL
			SELECT (SELECT e.run_id FROM {{schema}}.events e WHERE e.run_id > ids.run_id ORDER BY e.run_id LIMIT 1)
			FROM ids WHERE ids.run_id IS NOT NULL)
		SELECT run_id FROM ids WHERE run_id IS NOT NULL) o
	WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.runs r WHERE r.run_id = o.run_id)
) u ORDER BY run_id COLLATE "C"`),
		// A run's index row (nulls without one) and its stream's last
		// event (nulls without any), in one snapshot: what DeleteRun
		// without force decides on.
		deletable: sub(`SELECT ` + rowColumns("r.") + `, e.seq, e.id, e.value
FROM (SELECT $1::text AS run_id) k
LEFT JOIN {{schema}}.runs r ON r.run_id = k.run_id
LEFT JOIN LATERAL (SELECT seq, id, value FROM {{schema}}.events WHERE run_id = k.run_id ORDER BY seq DESC LIMIT 1) e ON true`),
		// A run's index row when forced ($2), or when it is still the
		// finished row DeleteRun checked (last key $3, checksum $4); then
		// its events when the row went (or forced: events without a row
		// are damage).
		delete: sub(`WITH r AS (DELETE FROM {{schema}}.runs WHERE run_id = $1 AND ($2 OR (status = 'finished' AND last_id = $3 AND crc = $4)) RETURNING 1),
e AS (DELETE FROM {{schema}}.events WHERE run_id = $1 AND (EXISTS (SELECT 1 FROM r) OR $2) RETURNING 1)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM e)`),
	}
	queueQueries(sub, &q)
	return q
}

// Schema is the PostgreSQL schema holding the store's tables.
func (s *Store) Schema() string { return s.schema }

// Parameters implements seams.RunStore, as kv does: the store's kind and
// the wire version of the events it writes.
func (s *Store) Parameters() map[string]string {
	return map[string]string{"kind": "postgres", "schema_version": events.CurrentSchemaVersion}
}

// Append implements seams.RunStore in one statement, so one transaction,
// durable on commit: the batch's events and the run's index row with its
// checksum. The append rules are seams.CheckAppend's, and the database
// enforces the tail: the index row moves on only from the row, and so the
// tail, the caller continues. That row is read and its checksum verified
// first (a damaged one refuses the append with ErrCorrupt), unless this
// process holds the run's lock and wrote the row itself: a driver's
// append is then one statement.
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
	l := s.leaseOf(runID)
	var known *indexRow // the row this process last wrote, when it holds the run
	if l != nil {
		l.mu.Lock()
		lost := l.lost
		known, l.row = l.row, nil // unknown until this append's answer is
		l.mu.Unlock()
		if lost != nil {
			return nil, lost
		}
	}
	// The batch must be valid continuing the stream the caller saw; the
	// database then checks that the stream is what the caller saw.
	if err := seams.CheckAppend(runID, after, false, after, evs); err != nil {
		return nil, s.refusal(ctx, runID, l, after, evs, err)
	}
	if after == maxULID {
		return nil, s.refusal(ctx, runID, l, after, evs, nil) // no key follows it; it is not a real tail
	}
	// A start names the agent whose workers the run is queued for: a
	// column, so one the rule for names refuses (text PostgreSQL cannot
	// hold among them) is refused here, writing nothing.
	var agent *string
	if after == (ulid.ULID{}) {
		if started, _ := events.As[events.RunStarted](evs[0]); started.Agent != "" {
			if err := seams.ValidAgent(started.Agent); err != nil {
				return nil, fmt.Errorf("pgstore: append to %q: run_started: %w", runID, err)
			}
			agent = &started.Agent
		}
	}
	// A run reserved while it had no index row (LockRun could put no lease
	// on it) that another writer started meanwhile without a lease: take
	// the lease now, or be refused as the lease's holder would refuse.
	if l != nil && after != (ulid.ULID{}) {
		l.mu.Lock()
		onServer := l.onServer
		l.mu.Unlock()
		if !onServer {
			if err := s.take(ctx, runID, l); err != nil {
				return nil, err
			}
		}
	}
	// prev is the row this append continues: none for a start.
	var prev *indexRow
	switch {
	case after == (ulid.ULID{}):
	case known != nil && known.info.LastID == after:
		prev = known
	default:
		row, found, err := s.readRow(ctx, s.pool, runID)
		if err != nil {
			return nil, fmt.Errorf("pgstore: append to %q: %w", runID, err)
		}
		if !found || row.info.LastID != after || row.info.Status != seams.StatusRunning {
			return nil, refuse(runID, row, found, after, evs, nil)
		}
		prev = &row
	}
	n := len(evs)
	ids, kinds, vals, crcs := make([][]byte, n), make([]string, n), make([][]byte, n), make([]int64, n)
	envs := make([]events.Envelope, n)
	info := seams.RunInfo{RunID: runID}
	if prev != nil {
		info = prev.info
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
		info.Apply(envs[i])
	}
	next := newRow(info)
	var owner *string // the lease this append holds, if any
	if l != nil {
		owner = &s.owner
	}
	q, args := s.q.start, []any{runID, ids, kinds, vals, crcs,
		string(info.Status), info.Steps, info.Events, string(info.StopReason), info.LastEvent, info.LastID[:], info.FirstEvent, int64(next.crc),
		owner, s.leaseTerm.Microseconds(), agent}
	if prev != nil {
		p := prev.info
		q, args[11] = s.q.cont, after[:]
		args = append(args[:13], p.Steps, p.Events, string(p.StopReason), p.FirstEvent, p.LastEvent, int64(prev.crc),
			owner, s.leaseTerm.Microseconds())
	}
	sent := time.Now()
	rows, cancel, err := s.exec(ctx, runID, q, n, args)
	switch {
	case err == nil:
	case pgconn.SafeToRetry(err) || errors.Is(err, errClosed):
		return nil, fmt.Errorf("pgstore: append %d events to %q (nothing was written): %w", n, runID, err)
	default:
		return nil, fmt.Errorf("pgstore: append %d events to %q (nothing was written unless the commit's answer was lost; Load tells): %w", n, runID, err)
	}
	if rows != int64(n) {
		return nil, s.refusal(ctx, runID, l, after, evs, nil)
	}
	if l != nil {
		l.mu.Lock()
		switch {
		case l.lost != nil: // a lease released meanwhile keeps its verdict
		case info.Status == seams.StatusFinished: // the append gave the lease back
			l.row, l.onServer, l.lost = &next, false, fmt.Errorf("run %q: %w: it is finished", runID, seams.ErrRunFinished)
		default:
			l.row, l.onServer, l.valid = &next, true, sent.Add(s.leaseTerm)
			l.noteCancel(cancel)
		}
		l.mu.Unlock()
	}
	return envs, nil
}

// maxULID is the largest key; no key can follow it.
var maxULID = ulid.ULID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// refusal explains an append refused against the stream the caller saw
// (rule, nil when the database found the stream moved, or the lease
// another's): it reads the stream's real state and applies
// seams.CheckAppend to it (refuse), so every store refuses with the same
// error; when the stream would take the append, the lease refused it:
// held by another (seams.ErrRunLocked), and when l, this process's lease,
// was the one the append held, it is lost from now on.
func (s *Store) refusal(ctx context.Context, runID string, l *lease, after ulid.ULID, evs []events.Event, rule error) error {
	row, found, err := s.readRow(ctx, s.pool, runID)
	switch {
	case errors.Is(err, ErrCorrupt):
		return fmt.Errorf("pgstore: append to %q: %w", runID, err)
	case err != nil && rule != nil:
		return rule
	case err != nil:
		return fmt.Errorf("pgstore: append to %q was refused and its stream's state could not be read: %w", runID, err)
	}
	err = refuse(runID, row, found, after, evs, rule)
	if rule != nil || !found || !errors.Is(err, seams.ErrTailMoved) || row.info.LastID != after {
		return err
	}
	// The stream is where the caller saw it: the lease refused the append.
	h, herr := s.holder(ctx, runID)
	if herr != nil {
		return err
	}
	var lost error
	switch {
	case l != nil && h.owner != s.owner:
		lost = fmt.Errorf("run %q: %w: this process's lease on it was taken over (held by %q until %s)", runID, seams.ErrRunLocked, h.owner, stamp(h.expires))
	case l != nil:
		return err // still ours: the stream moved and back, which tails cannot
	case h.live:
		return fmt.Errorf("append to %q: %w (%q, lease until %s)", runID, seams.ErrRunLocked, h.owner, stamp(h.expires))
	default:
		return err
	}
	l.mu.Lock()
	if l.lost == nil {
		l.lost = lost
	}
	l.mu.Unlock()
	return lost
}

// stamp formats a lease's expiry.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// refuse is the error of an append refused against the stream the caller
// saw, given the run's index row (found false: none).
func refuse(runID string, row indexRow, found bool, after ulid.ULID, evs []events.Event, rule error) error {
	var tail ulid.ULID
	if found {
		tail = row.info.LastID
	}
	if err := seams.CheckAppend(runID, tail, found && row.info.Status == seams.StatusFinished, after, evs); err != nil {
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
// and last key its index row names. The index row must sum to its
// checksum and, when every event decoded, agree with the stream in every
// other column too (status, steps, stop reason, first and last event
// time): a row the stream contradicts is damage even when it sums.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", err)
	}
	return retry(ctx, func() ([]events.Envelope, error) { return s.load(ctx, runID, nil, 0, ulid.ULID{}) })
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
		_, err := s.load(ctx, runID, each, 0, ulid.ULID{})
		if err == nil || delivered || attempt == 3 || !pgconn.SafeToRetry(err) || ctx.Err() != nil {
			return err
		}
	}
}

// HasRun implements seams.RunFinder: whether runID has an index row or
// events.
func (s *Store) HasRun(ctx context.Context, runID string) (bool, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return false, fmt.Errorf("pgstore: has run: %w", err)
	}
	var found bool
	if err := s.pool.QueryRow(ctx, s.q.has, runID).Scan(&found); err != nil {
		return false, fmt.Errorf("pgstore: has run %q: %w", runID, err)
	}
	return found, nil
}

var _ seams.RunTailer = (*Store)(nil)

// LoadAfter implements seams.RunTailer: the run's index row and the rows
// numbered from seen on, in one statement (one primary-key range), the
// seen-th row checked against last and not decoded. Anything out of the
// way there — the seen-th row missing or another, a gap, a value that
// does not decode, a row that does not anchor the stream — and it reads
// the whole stream as Load does, answering as Load answers
// (seams.StreamAfter).
func (s *Store) LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error) {
	if seen > 0 {
		if err := seams.ValidRunID(runID); err != nil {
			return nil, fmt.Errorf("pgstore: load: %w", err)
		}
		out, err := retry(ctx, func() ([]events.Envelope, error) { return s.load(ctx, runID, nil, seen, last) })
		var damage *events.DamageError
		if !errors.As(err, &damage) {
			return out, err
		}
	}
	stream, err := s.Load(ctx, runID)
	return seams.StreamAfter(runID, stream, err, seen, last)
}

// load is Load, with each set Scan, and with seen set what LoadAfter reads
// first: the events after the first seen, the seen-th of which must be
// seenLast (the index row's anchors checked, not its other columns).
func (s *Store) load(ctx context.Context, runID string, each func(events.Envelope) error, seen int, seenLast ulid.ULID) ([]events.Envelope, error) {
	rows, err := s.pool.Query(ctx, s.q.load, runID, int64(max(seen, 1)))
	if err != nil {
		return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
	}
	defer rows.Close()
	r := events.StreamReader{RunID: runID, Each: each}
	var (
		sc      rowScan
		seq     *int64
		id      []byte
		kind    *string
		value   []byte
		crc     *int64
		n       = int64(max(seen, 1)) - 1
		last    ulid.ULID
		summary seams.RunInfo // the stream's, as the store folds each event it writes
		clean   = true        // no problem found in the stream
		dest    = append(sc.dest(), &seq, &id, &kind, &value, &crc)
	)
	problem := func(err error) {
		r.Problem(err)
		clean = false
	}
	for rows.Next() && !r.Stopped() {
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
		}
		if seq == nil {
			break // the index row, after every event
		}
		n++
		if *seq != n {
			problem(fmt.Errorf("event %d is stored as number %d: events are missing or were added", n, *seq))
			n = *seq
		}
		if len(id) != 16 {
			problem(fmt.Errorf("event %d: key %x is not a ULID", *seq, id))
			continue
		}
		key := ulid.ULID(id)
		if seen > 0 && *seq == int64(seen) { // the caller's last, not handed over again
			if key != seenLast {
				problem(fmt.Errorf("event %d is %s, not %s as seen: the stream no longer continues", *seq, key, seenLast))
			}
			last = key
			continue
		}
		if key.Compare(last) <= 0 {
			problem(fmt.Errorf("event %d: key %s does not follow %s", *seq, key, last))
		}
		last = key
		if sum, ok := events.SealedChecksum(value); ok && (crc == nil || uint32(*crc) != sum || *crc < 0 || *crc > 1<<32-1) {
			problem(fmt.Errorf("event %d (%s): its crc column disagrees with the value's checksum", *seq, key))
		}
		env, ok := r.Value(key, value)
		switch {
		case !ok:
			clean = false
		case kind == nil || *kind != string(env.Kind):
			problem(fmt.Errorf("event %d (%s): its kind column says %v, the value is %s", *seq, key, deref(kind), env.Kind))
		}
		if ok {
			summary.Apply(env)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: load run %q: %w", runID, err)
	}
	row, indexed, rowErr := sc.row()
	switch {
	case r.Stopped():
	case n < int64(seen):
		r.Problem(fmt.Errorf("run %q holds %d events, fewer than the %d seen", runID, n, seen))
	case !indexed && n > 0:
		r.Problem(fmt.Errorf("run %q has %d events but no index row", runID, n))
	case indexed:
		if rowErr != nil {
			r.Problem(rowErr)
		}
		if row.info.RunID == "" {
			break // no values to compare
		}
		if int64(row.info.Events) != n {
			r.Problem(fmt.Errorf("the stream holds %d events, its index row counts %d: events are missing or were added", n, row.info.Events))
		}
		if row.info.LastID != last {
			r.Problem(fmt.Errorf("the stream's last event is %s, its index row names %s: the tail is missing or was added", last, row.info.LastID))
		}
		if clean && seen == 0 && int64(row.info.Events) == n && row.info.LastID == last {
			for _, d := range disagreements(row.info, summary) {
				r.Problem(d)
			}
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

// Runs implements seams.RunReader in one statement (one snapshot): the
// index rows, ordered by run id (bytewise, as kv orders them), and the
// runs whose events have no index row. A row that breaks the index's
// rules or fails its checksum, and a stream without a row, are listed
// with StatusCorrupt (only the run id and the row's coordination known),
// as kv lists them: loading the run reports the damage. Each entry
// carries its coordination — agent, lease (the last holder's owner and
// expiry stay visible after it expired, until another takes the run or
// it is given back), failures, retry time, cancel request; none for a
// finished run — and its liveness (seams.RunInfo.Liveness) by the
// server's clock as of the statement.
func (s *Store) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	return retry(ctx, func() ([]seams.RunInfo, error) { return s.runs(ctx) })
}

func (s *Store) runs(ctx context.Context) ([]seams.RunInfo, error) {
	rows, err := s.pool.Query(ctx, s.q.runs)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list runs: %w", err)
	}
	defer rows.Close()
	var (
		out  []seams.RunInfo
		sc   rowScan
		co   coordScan
		now  time.Time
		dest = append(append(sc.dest(), co.dest()...), &now)
	)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("pgstore: list runs: %w", err)
		}
		out = append(out, listed(&sc, &co, now))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: list runs: %w", err)
	}
	return out, nil
}

// Close sends the appends already queued (refusing new ones), then gives
// back the leases of the runs this process still holds (they are free for
// other workers at once, and their drivers here append nothing more), and
// closes the pool, waiting for other connections in use to be returned.
func (s *Store) Close() error {
	if s.stop != nil {
		s.stop()
	}
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
