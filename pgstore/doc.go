// Package pgstore is the PostgreSQL implementation of seams.RunStore,
// seams.RunReader and a worker pool's seams.RunQueue, for services whose
// workers run on many processes or machines: any worker can continue any run, and readers (polyloop-inspect,
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
// starting together migrate once; schema_migrations records them.
// Migration 3 adds the runs' lease columns: workers of version 2, which
// hold runs with session advisory locks, must stop first. Migration 5 adds
// the queue's columns and its index (see Queue); workers of version 4
// still running beside it leave those columns as they are. A schema
// at a newer version than SchemaVersion is refused naming both versions;
// a read-only store refuses any other version. Migration 2 gives the runs
// rows their checksum, computing it for the rows already there over their
// values as they stand (Load's comparison of each row with its stream
// still finds one changed before); workers of version 1 must stop first,
// since their appends write rows without one.
//
// # Appends
//
// An append is one SQL statement: it moves the run's index row on — only
// if the row is still the one the append continues (its last key the tail
// the caller names, the run not finished, every column and the checksum
// as the writer read or wrote them, and the run's lease as described
// below) — and inserts the events numbered after the stream's length. The
// writer computes the new row and its checksum: from the row it wrote
// itself when this process holds the run's lease (a driver's append is one
// statement), else from the row it reads first, whose checksum must hold
// (a damaged row refuses the append with ErrCorrupt). The database thereby
// enforces the expected-tail rule: of two workers continuing one run, the
// second waits for the first's row lock, then finds another last key and
// writes nothing; of two starting one run, the second's insert of the
// index row conflicts and writes nothing; and the primary key (run_id,
// seq) backs both. A refused append is explained by seams.CheckAppend
// applied to the stream's real state, so every store refuses alike. Keys
// are minted after the caller's tail (which is the stream's last key
// whenever the append succeeds), so they increase per run whatever the
// clocks of the machines say.
//
// Appends from many runs are grouped, one group in flight at a time: an
// append that finds no group in flight sends itself (a lone run's append
// is one round trip from its own goroutine); what is queued while a group
// is in flight goes in the next one, sent by the first appender waiting —
// as one pgx batch, which PostgreSQL runs as one implicit transaction:
// one round trip, one commit, one WAL flush. A group holds at most one
// append per run (up to 256), in the order they were queued. (Two or four
// smaller groups in flight at once gave half the throughput on the
// machines measured: each commit is a WAL flush.) The group's
// continuations are one statement over arrays (a statement's fixed cost
// on the server was most of an append's), starts their own statements in
// the batch. Each run's own conditions decide it: an append refused by its
// tail or its lease affects no rows and refuses nothing else. A statement
// the server answers with an error (a constraint a damaged stream breaks)
// aborts its group's transaction, committing nothing; the group is then
// sent again one statement at a time, so the error is that append's alone.
//
// Durable on commit: every connection runs with synchronous_commit=on,
// whatever the server's or role's default, so Append returns only after
// PostgreSQL has flushed its WAL (and, where configured, a synchronous
// standby has it).
//
// A connection lost mid-append is an error; whether the commit happened is
// then unknown to the caller, and the engine stops the run. The run stays
// resumable: Resume loads the stream as committed and continues it (an
// event that did commit is simply there).
//
// # Leases
//
// The store implements seams.RunLeaser across processes and machines with
// a lease on the run's index row: lease_owner (Store.Owner) and lease_expires (the
// server's clock, so the workers' clocks never decide). The engine takes
// it (LockRun) before it reads a run and gives it back when the run
// returns. No connection is held in between: a statement takes a pooled
// connection for as long as it runs, so a run waiting on its model or a
// tool holds none, and a pool of a few connections serves thousands of
// runs.
//
//   - Taking: a conditional UPDATE sets the owner (Store.Owner: a name and
//     a random suffix, so no two Stores share leases) and an expiry of now
//     plus the term (Options.LeaseDuration, DefaultLeaseDuration) when the
//     row has no owner, its lease expired, or the owner is this store's.
//     A run another live worker holds is refused at once with
//     seams.ErrRunLocked naming the holder and the expiry (engine.ErrRunBusy
//     before anything is called or executed). A run without a row yet (one
//     being started) is reserved in this process; its first append writes
//     the row with the lease on it, and of two workers starting it the
//     second is refused there, having done nothing.
//   - Renewing: every append of the holder sets the expiry to now plus the
//     term, and once every third of the term one statement renews every
//     lease of the process with less than two thirds of its term left, so
//     a run waiting long on its model keeps its lease (it skips a row an
//     append in flight has locked: that append renews the lease itself,
//     and waiting for it could deadlock with the append's group).
//   - Holding: the holder's appends require the owner to still be its own;
//     an append of a worker not holding the lease requires that nobody
//     live holds it. Before every model call and every side effect the
//     engine asks HoldsRun, which answers from this process's own clocks
//     when more than a quarter of the term is surely left by both the
//     monotonic and the wall clock (measured from when the renewing
//     statement was sent, before the server set the expiry; a suspended
//     machine's monotonic clock stands still) and renews the lease first
//     otherwise.
//   - Losing: when a renewal or an append finds another owner, or HoldsRun
//     cannot renew (the server is unreachable), the worker stops driving
//     the run at that point: it executes nothing more, appends nothing
//     more, and the engine returns engine.ErrRunBusy (or the renewal's
//     error; the run stays resumable). A worker that was paused past its
//     term (SIGSTOP, a GC pause, a partition) finds this out when it
//     wakes, before its next call, side effect or append. What no lease
//     design removes: a worker paused between HoldsRun's answer and the
//     tool call itself may act after its lease expired; a tool that must
//     be exactly-once keys its effect on the action's result id
//     (seams.ActionCall.ResultID), which a takeover's replay carries too.
//   - Releasing: the append that finishes a run clears its lease in the
//     same statement; a run that returns unfinished gives its lease back
//     then (the run is free to others at once); Close sends the appends
//     already queued, then gives back every lease the process still holds. A worker that dies gives back nothing: its runs are
//     taken over once their leases expire, one term at most.
//
// The lease is the courtesy that spares a second worker's replays; the
// tail rule stays the guarantee: a driver that does not lease, or whose
// lease was lost, still cannot continue a run another continued. The
// lease columns are coordination, not the run's data, so they are outside
// the row's checksum: a damaged lease at worst keeps a run refused until
// it expires.
//
// # Queue
//
// The store implements seams.RunQueue, seams.RunCanceller and
// seams.RunDescriber for a worker pool with more columns on the runs row:
// agent (RunStarted.Agent, written by the start append, which refuses a
// name seams.ValidAgent refuses), failures, last_error and retry_at (a
// worker's failures to drive the run), and cancel_by and cancel_at (an
// operator's request). Like the lease columns they are coordination, not
// the run's data, so they are outside the row's checksum.
//
//   - Claiming: ClaimRuns is one statement: an UPDATE that leases to this
//     store (its owner, an expiry of now plus the term) the runs two
//     sub-selects pick — unfinished, started for one of the agents named,
//     retry time come, and either free (no lease) or with a lease that ran
//     out; free ones first, at most max, each FOR UPDATE SKIP LOCKED:
//     concurrent claimers skip each other's rows instead of waiting for
//     them, and never get one run twice. The sub-selects read two ranges
//     of each named agent in the partial index runs_claimable (agent,
//     lease_expires NULLS FIRST) WHERE status = 'running' AND agent IS NOT
//     NULL: the free runs (a NULL expiry) and those whose expiry is past.
//     A run leaves that index in the statement of the append that
//     finishes it, so a claim reads its agents' claimable runs only —
//     never another agent's queue, a run a live worker holds or a finished
//     run, however many there are (runs waiting out a retry are read and
//     skipped); a run started without an agent is never in it. A run a driver of this store is letting go of
//     (its lease already given back, its reservation not yet forgotten) is
//     skipped: its claim could not be locked.
//   - Driving a claim: a claimed run is held as LockRun holds it, and
//     taking a lease accepts the store's own owner, so the claimer's
//     LockRun succeeds and any other store's is refused. The claim's lease
//     is renewed only once LockRun has registered the run in this process:
//     a worker locks right after claiming; a claim nobody locks expires
//     after one term, and the run is claimable again.
//   - Giving back: ReleaseRun clears the lease when it is this store's or
//     already cleared (the engine's LockRun release comes first), and
//     retry_at is now plus the delay by the server's clock (cleared for
//     none and no failure: claimable at once); a failure also counts in
//     failures and is kept in last_error (valid UTF-8, cut at
//     events.MaxEnvErrorBytes). A run
//     another worker holds, or a driver of this store, a finished one, or
//     one started without an agent, is left as it is.
//   - Requeueing: RequeueRun clears retry_at, failures, last_error and a
//     lease that ran out, in one conditional UPDATE; a refusal is
//     explained by reading the row (seams.ErrNoRun, seams.ErrRunFinished,
//     seams.ErrNotQueued, seams.ErrRunLocked naming the live holder).
//   - Cancelling: RequestCancel is one UPDATE, durable on commit, that
//     keeps the first request and returns it with the live holder.
//     CancelRequested costs no round trip for a run this store holds:
//     every statement that touches the row of a run it holds — taking it,
//     the holder's appends (alone, or in a group's one statement of
//     continuations), renewals — returns the run's request in the same
//     statement (an append sends nothing more), and the lease keeps it;
//     a request through this store is kept at once. A request another
//     process records is seen by the holder when its next such statement
//     reads it back: its next append (which waits for the request's row
//     lock, so a request committed before the append of an action's
//     intent is seen before the action executes), or its next renewal,
//     a third of the term at most for a run waiting on its model. For a
//     run it does not hold, CancelRequested reads the row. A finished run
//     has no request (it was carried out, or is moot): statements and
//     listings return none for a finished row.
//   - Listing: Runs and Describe fill the agent, the holder (owner and
//     expiry: the last holder's stay visible after its lease ran out, so
//     an operator sees which worker died, until another takes the run or
//     it is given back), failures, last error, retry time and cancel
//     request, and set the status with seams.RunInfo.Liveness against the
//     server's now, read in the same statement. A finished run has left
//     the queue: it is listed without any of them (the row keeps its
//     agent and failures, moot), as kv lists it.
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
// # Forks
//
// ForkRun (seams.RunForker, for engine.Fork) is one transaction: the new
// run must have no row and no events; the source's row is read (checksum
// verified) and its events up to the last one copied, numbered from 1
// without a gap, decoded; the copies, resealed under keys minted for the
// new run, and its row summing them go in with the statement that starts
// a run, agent column and the lease of a driver that reserved the new id
// included.
//
// # Past one primary
//
// One primary carries every append of its runs: on the 2-core machine the
// benchmarks run on (BENCHMARKS.md, "At fleet scale"), 6,000 to 7,000
// grouped appends a second — 3,100 steps a second for 64 runs, 3,500 for
// 2,048 — with the machine's CPU the limit (the raw floor of the same rows,
// grouped, writes 4,750 steps a second there).
// Beyond that a fleet grows in three ways, none of which this package
// does yet:
//
//   - Runs partitioned by id across databases. A run lives in one
//     database, whole: its stream, its index row and its lease, so every
//     rule above holds per database unchanged. An opener would take several
//     URLs and pick a run's database by a stable hash of its id
//     (rendezvous hashing, so that adding a database moves only the runs
//     that hash to it, and only if they are moved: a run already written
//     stays where it is unless copied whole); listings merge the
//     databases' listings by run id. Throughput grows with the databases,
//     since no statement touches two runs' rows — except a group, which
//     would be per database.
//   - Readers on replicas. A streaming replica applies the primary's
//     transactions whole and in commit order, so every stream it shows is
//     a prefix the primary committed, sound: Load and verify pass on it,
//     and a run's log there is its log as of the replica's lag. The index
//     rows lag the same way: runs may list a finished run as running, and
//     the viewer's live page and a follower trail by the lag. A lease read
//     on a replica is as stale, and its expiry is compared with the
//     replica's clock. Readers opened ReadOnly never write, so pointing
//     polyloop-inspect and the viewer at a replica's URL works as it is;
//     everything that decides — Run, Resume, leases, deletes — goes to the
//     primary.
//   - A distributed SQL engine speaking PostgreSQL's protocol (CockroachDB,
//     YugabyteDB). The store's statements keep to what those engines also
//     run where that costs nothing: a lease is a conditional UPDATE on the
//     run's row, not a session advisory lock; the tail rule is a
//     conditional UPDATE and ON CONFLICT DO NOTHING; no sequences, no
//     triggers, no foreign keys. What would differ: they run transactions
//     serializable and answer a conflict with a retryable error (40001)
//     where PostgreSQL waits for the row lock and re-checks the condition,
//     so an append would have to retry such an error by reading the row
//     again (a conflict there is a moved tail, or a lease changing hands);
//     Migrate takes a transaction-scoped advisory lock, which they lack (a
//     lock row taken with a conditional INSERT would do); synchronous_commit
//     and plan_cache_mode are settings they ignore or reject; the listing's
//     recursive skip scan and the C collation's ordering would need checking
//     on each; and a commit there is a consensus round between replicas,
//     so a step costs that round trip instead of a local WAL flush, and
//     grouping appends matters more.
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
