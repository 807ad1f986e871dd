// Package pgstore is the PostgreSQL implementation of seams.RunStore and
// seams.RunReader, for services whose workers run on many processes or
// machines: any worker can continue any run, and readers (polyloop-inspect,
// the viewer) read while agents write.
//
// # Tables
//
// A store lives in one schema (DefaultSchema, or Options.Schema): the run
// index runs (one row per run: status, steps, events, stop reason, first and
// last event time, last key, and crc, the CRC-32C of all of them that kv's
// index entries carry too, seams.RunInfo.Checksum), and events (run_id,
// seq, id, kind, value, crc; PRIMARY KEY (run_id, seq)). value is the envelope exactly as package
// kv stores it — events.Marshal's bytes, sealed with their CRC-32C — so one
// decoder (events.Unmarshal) serves both stores and a run copied between
// them is byte-identical; crc repeats the checksum for SQL's sake. The
// tables come from embedded, numbered migrations (migrations/*.sql), applied
// by Open (or Migrate) under a transaction-scoped advisory lock, so workers
// starting together migrate once; schema_migrations records them. A schema
// at a newer version than SchemaVersion is refused naming both versions;
// a read-only store refuses any other version. Migration 2 gives the runs
// rows their checksum, computing it for the rows already there over their
// values as they stand (Load's comparison of each row with its stream
// still finds one changed before); workers of version 1 must stop first,
// since their appends write rows without one.
//
// # Appends
//
// An append is one SQL statement, so one transaction: it moves the run's
// index row on — only if the row is still the one the append continues
// (its last key the tail the caller names, the run not finished, every
// column and the checksum as the writer read or wrote them) — and inserts
// the events numbered after the stream's length. The writer computes the
// new row and its checksum: from the row it wrote itself when this process
// holds the run's lock (a driver's append is one round trip), else from
// the row it reads first, whose checksum must hold (a damaged row refuses
// the append with ErrCorrupt). The database thereby enforces the expected-tail rule: of
// two workers continuing one run, the second waits for the first's row lock,
// then finds another last key and writes nothing; of two starting one run,
// the second's insert of the index row conflicts and writes nothing; and
// the primary key (run_id, seq) backs both. A refused append is explained by
// seams.CheckAppend applied to the stream's real state, so every store
// refuses alike. Keys are minted after the caller's tail (which is the
// stream's last key whenever the append succeeds), so they increase per run
// whatever the clocks of the machines say.
//
// Durable on commit: every connection runs with synchronous_commit=on,
// whatever the server's or role's default, so Append returns only after
// PostgreSQL has flushed its WAL (and, where configured, a synchronous
// standby has it). Concurrent appends from many runs are group-committed by
// PostgreSQL itself; nothing in the store serialises them.
//
// A connection lost mid-append is an error; whether the commit happened is
// then unknown to the caller, and the engine stops the run. The run stays
// resumable: Resume loads the stream as committed and continues it (an
// event that did commit is simply there).
//
// # Locks
//
// The store implements seams.RunLocker across processes and machines: the
// engine reserves a run before reading it, with a session-level advisory
// lock (pg_try_advisory_lock on the schema and run id) held on a pooled
// connection until the run returns; the run's appends go through that same
// connection. A second worker — in this process or any other — is refused
// at once (engine.ErrRunBusy) before it calls the model or replays
// anything, so it cannot mistake a live worker's action in flight for a
// crash's. A worker that dies drops its connection, and PostgreSQL releases
// the lock. The lock is the courtesy; the tail rule stays the guarantee
// (a driver that does not lock, or a lock lost with its connection, still
// cannot continue a run another continued). A running run holds one
// connection, so Options.MaxConns (DefaultMaxConns) bounds the runs one
// process drives at once.
//
// # Reading
//
// Load reads a run in one statement (one snapshot) and checks it: every
// value's checksum, the crc and kind columns against the value, seq running
// 1, 2, 3 without a gap, keys increasing, the index row's checksum, and the
// row against the stream — its length and last key, and, when every event
// decoded, its status, steps, stop reason and times (events without an
// index row are damage too: the tables have no foreign key, whose per-row
// check cost a tenth of a step); damage is reported like kv's
// (*events.DamageError with everything that did decode, wrapped with
// ErrCorrupt). Runs lists a row failing its checksum, and a run whose
// events have no row (found by one index probe per run of the events'
// primary key), as seams.StatusCorrupt, as kv does. LoadAfter reads the
// index row and the rows numbered from the last one a reader saw, one
// range of the events' primary key, and reads as Load does when they do
// not fit. The row alone never
// decides that a run is finished where the stream can: DeleteRun without
// force requires the stream's last event to be run_finished too. A store
// opened with Options.ReadOnly runs every statement in a read-only
// transaction and never migrates.
//
// # Connecting
//
// Open takes a postgres:// URL or a key=value string as libpq does (the
// pgxpool parameters such as pool_max_conns too). The first connection is
// made at Open and bounded by the connect timeout (DefaultConnectTimeout);
// an unreachable server, wrong credentials and a missing database are
// errors naming host, port, database and user (never the password), on one
// line that leads with the cause: the server's own error when it answered,
// not pgx's list of every attempt (with TLS, then without). A connection
// string that does not parse is an error saying why, without quoting it.
// Run ids follow seams.ValidRunID: one PostgreSQL text cannot hold (a NUL
// byte, invalid UTF-8) is refused before any statement, with
// seams.ErrInvalidRunID, as every store refuses it.
//
// What does not live here: the append rules (seams.CheckAppend), the
// decoding (events), the bbolt store (kv), and the choice between stores
// from a path or URL (package stores). pgx types never leave this package.
package pgstore
