// Package kv is the bbolt implementation of seams.RunStore: one file, one
// append-only log of every run's events keyed by monotonic ULIDs (each
// event linked to its run's previous one), msgpack envelope values, and an
// index bucket kept in the same transaction that lists runs without
// scanning their streams. Files made before the log keep a nested bucket
// per run (format 1), read and written as they are until Compact moves
// them to the log.
//
// # Basics
//
// Open a file with Open; share the *Store between all runs of a process; Close
// it when done. Append writes one call's events in one transaction and
// returns once they are durable. Load returns a run's stream; a run never
// written is an empty stream and no error. Runs lists the index, and
// Describe one run's entry, with who holds each run (see The queue).
//
// # Group commit
//
// Appends from concurrent runs are group-committed, leader-style: an
// appender that finds no commit in progress becomes the leader and commits,
// in its own goroutine, every append queued at that moment in one bbolt
// transaction, so one fsync serves them all; each caller returns only when
// the transaction holding its events is durable. Appends queued while the
// leader applies its group join it (up to Options.MaxGroup) before it
// commits: at 64 runs, the runs the previous commit released queue up
// exactly then. After a commit that carried more than one append, the
// leader also waits a little for more (Options.CommitDelay, started
// again by each append that joins), polling the queue and
// yielding its processor so the released runs can append: without it, 64
// runs settle into two cohorts that take turns, each commit carrying half
// of them; with it one commit carries most. (PostgreSQL's commit_delay is a
// cousin: it sleeps once before the flush, when enough other transactions
// are open.) When a single yield outlasts the delay, the processors are
// busy enough that appends queue on their own, and the leader commits
// without waiting further. A group holds at most Options.MaxGroup appends
// (DefaultMaxGroup): small enough that the leader applies it within a
// scheduler time slice, and that with thousands of runs the runs one commit
// releases compute their next appends while the leader commits the next
// group. The leader then hands leadership to the oldest waiting appender,
// waking the group's appenders without holding the queue's lock. A lone
// append never hands off to another goroutine, and waits for company only
// right after a commit of several appends (anyone's): a
// run appending alone commits at once. (bbolt's own Batch waits up to its
// MaxBatchDelay for company whatever came before, which makes a lone run's
// durable write many times slower.) A refused append in a group
// does not affect the others: the rules of seams.CheckAppend are checked
// against the index before anything of that append is written; a failure
// after an append began writing (bbolt's own) rolls the whole group back,
// so an append is all or nothing. If ctx ends before an append was taken
// into a transaction, it is withdrawn and nothing of it is written (the
// engine passes appends that must not be lost a context detached from the
// run's, see engine's doc on cancellation).
//
// # Checksums and anchors
//
// Each value is sealed with its CRC-32C once its key is minted (see package
// events). Each run's index entry carries the stream's length and last key
// and a CRC-32C of its own, all written in the transaction that appends, so
// Load can tell a stream that lost an event — in the middle or at the tail,
// which no per-value checksum could see — and an index entry that was
// altered. Load verifies every value and both anchors, and that the
// run has a stream and an index entry or neither; it reports every problem
// at once (an *events.DamageError beside the events that decoded). Runs
// lists a damaged entry, and a stream whose entry is gone, as
// StatusCorrupt.
//
// # Tails and keys
//
// Append checks the tail its caller names against the run's last key (the
// index entry's, proven in the log; the bucket's last in format 1) inside
// the writing transaction, so appends grouped into one transaction see
// each other and of two continuing one tail exactly one wins. A key another
// run already holds (its clock was ahead) is skipped; in the log, a key
// above the highest it has held needs no lookup for that. The leader skips
// decoding an index entry that is, byte for byte, the one this process
// wrote with the run's last append (writtenEntries), and encodes entries
// byte by byte, without msgpack's encoder. Keys are ULIDs minted after
// that last key (events.IDSource.NextAfter), whatever the clock says: after a process wrote with its clock
// ahead (an NTP step, a VM migration, a restored snapshot), the run's next
// keys carry the future millisecond, incremented, until the clock catches
// up. What that leaves behind: event times read from keys (Envelope.Time,
// RunInfo's first/last event) show the future moment, and step_wall_ms of
// steps written meanwhile reads 0. Other runs are not affected. The Store
// also embeds seams.RunLocks, so one process runs one driver per run; the
// file lock keeps other processes out.
//
// # Opening a file
//
// Open takes the file lock itself (exclusive for a writer, shared for
// readers), waiting at most Options.LockTimeout; ErrLocked says whether the
// holder is another process or this one (a second Open of a file this
// process has open fails at once). It then proves the file sound before
// bbolt maps it (file.go): both meta pages valid, the file as
// long as its pages, and every page reachable from the root in bounds, of
// the right type, referenced once, with elements inside their pages and keys
// in order — what bbolt's consistency walk checks, so bbolt never faults
// on a short mapping or panics, and the freelist rebuild (a walk bbolt runs
// in a goroutine of its own, where a panic kills the process) finds nothing
// wrong. A damaged file yields ErrCorrupt naming the page, something that
// is not a store ErrNotAStore (an empty file, a text file, a directory, a
// bbolt file of another application: a store carries a format marker, the
// "polyloop" bucket, written when it is created), and the refused file is
// left as it was: unlocked, unmapped, its descriptor closed, its bytes
// unchanged.
//
// A damaged meta page is refused, not silently rolled back to the other
// one: bbolt keeps the last two transactions' meta pages and falls back to
// the older when the newer fails its checksum, which loses the newer
// transaction without a word — and a lost durable intent is a side effect
// executed twice. A meta page is written within one disk sector, so a crash
// mid-write leaves the old or the new page, not a torn one; a bad checksum
// means damage. Options.AllowMetaRollback accepts the fallback for recovery
// tooling and Store.MetaRollback reports it.
//
// Why a walk at open rather than a synced freelist (both measured in
// BENCHMARKS.md, BenchmarkFreelistSync and BenchmarkOpen): with the
// freelist synced bbolt would not walk the file at open, but every commit
// writes the freelist page too, and bbolt would trust a damaged freelist
// page, while damaged pages would surface later, in writes, as panics.
// Without it bbolt walks every page anyway, lazily and where a panic cannot
// be caught; kv's walk at open is paid once per open, and turns every
// structural problem into an error. A file
// whose freelist another tool synced is checked too: no page it lists may
// be in use.
//
// A new store is built in a temporary file beside the path and linked in,
// so the path never holds half a store. Read-only opens share the lock
// with other readers. The freelist is not written on each commit (bbolt's
// NoFreelistSync): it saves a page write per commit. Page faults while
// reading (a file truncated while open) are turned into errors with
// debug.SetPanicOnFault.
//
// # Readers of a file being written
//
// bbolt lets no second process open a file being written, so the writer
// serves its readers. A Store opened read-write listens on a Unix socket
// beside its file (SocketPath: the path with ".sock" added) and answers
// the reads of a read-only Store — Runs, Describe, Load, LoadAfter, Scan —
// to processes of its own user: the socket's mode is 0600, and on Linux
// each peer's user id is checked (SO_PEERCRED; elsewhere the socket's mode
// alone keeps other users out). A reader in turn trusts only its own
// user's writer: Dial refuses a symbolic link or another kind of file at
// the socket's path, a socket another user owns, and, on Linux, a socket
// whose listening process runs as another user (ErrUntrustedSocket) — in a
// shared directory another user could put a socket where a store's
// belongs; a writer that finds one there leaves it and serves no readers
// (Serving says whose it is). A reader opens it with Dial, which gives a
// Remote, or with OpenReader, which gives a Reader: each read opens the
// file read-only for a moment (reads close together share one opening, a
// quarter of a second at most, then a pause in which a waiting writer
// takes the lock), and while a process holds the file for writing reads
// go through its socket instead. A long-lived reader (a viewer, a follower
// of a run) thus holds the file only while one read lasts: a writer that
// starts meanwhile waits for it up to its Options.LockTimeout
// (DefaultLockTimeout when zero), and a single read of a large run can
// hold the file longer than that, so an agent whose runs are large wants
// a longer LockTimeout. The socket
// speaks HTTP/1.1 with msgpack bodies, versioned (ProtocolVersion;
// ErrProtocolVersion when writer and reader differ). The writer reads in
// its own read transactions, which see committed transactions only
// (bbolt makes a commit visible just before it syncs it, so a read may
// see an event a moment before its Append returns, and one a crash then
// loses; with NoSync, commits are not synced at all) — copies what it read out of the transaction, and sends it after:
// no transaction waits on a slow reader. A run's values go undecoded, in
// chunks of a few MiB, each read in a transaction of its own as of the
// index entry the first read (a run appended meanwhile is read as it stood
// then), so a served read of a big run costs the writer a chunk's memory,
// not the run's; at most two reads of runs' values are served at once, a
// read stops as soon as its deadline passes or the store closes, the
// requests in progress take a place each (16 at most: connections kept
// alive between requests hold none; one more waits a little, then is
// refused as busy, saying so), and
// appends never wait for the socket, which has goroutines of its own. The
// values are decoded and checked on the reader's side (checksums
// included), the problems the writer found beside them, so a read through
// the socket answers what a read of the file would, damage included.
//
// Options.NoServe turns the socket off (a Store opened inside a
// testing/synctest bubble needs it: a listener waiting for connections is
// not durably blocked); Store.Serving says where it
// listens or why it does not (read-only, NoServe, a socket path longer
// than the 107 bytes a socket address holds, a file that is not a socket
// in its place, the listen's failure) — none of which fails Open. A
// socket left by a writer that was killed is replaced by the next writer,
// which holds the file's exclusive lock. Close first cancels the served
// reads and waits for them (requests that come meanwhile are answered
// that the writer is closing, and a Reader then waits for the file's
// lock), then stops the listener, ends its connections and removes the
// socket, and only then closes the file. A writer that stops answering
// in the middle of a read (killed) fails that read with ErrWriterGone;
// the file is then no longer held, and a Reader's next read opens it.
//
// # Pages, retention, compaction
//
// New files use 16 KiB pages (Options.PageSize; a file keeps the page size
// it was made with) and the log (and format 1's streams) fill their pages
// whole (keys only grow): a step's compressed StepCompleted is a few KiB,
// which 4 KiB pages held one to a page. A step's texts are stored once
// (BenchmarkStorageBytes) (events' references: kv remembers each
// run's latest reply as of its tail, so a StepCompleted appended right
// after it refers to it). DeleteRun (seams.RunDeleter) removes a run's
// events (its chain, or its bucket) and index entry in one transaction,
// reserving the run meanwhile; bbolt reuses the freed pages, so a store
// whose old runs are deleted (retention.Expire) stops growing. Compact rewrites a file without its
// free pages into a new file and renames it over the old one, with no
// process holding the store, then syncs the directory (where the platform
// can; not on Windows) so that the swap survives a power cut; an Open that waited for the old file's lock
// sees the file replaced and opens the new one. DataSize is the bytes in
// use up to the high-water mark (the file is grown ahead of need).
//
// ForkRun (seams.RunForker, for engine.Fork) is one write transaction of
// its own, as DeleteRun is, outside the group commit: it reads the
// source's stream as Load does (damage refuses the fork), then writes the
// new run's RunStarted and the source's sealed values up to the last one
// copied, resealed under keys minted for the new run as Append mints
// them, with its first-key record, index entry and queue entry. The
// copied steps keep their references to the replies before them, which
// the copy holds in the same order; the new run's latest reply is known
// as of its tail (the prefix's), so its next step may refer to it.
//
// # Layout: one log
//
// Why one log and not a bucket per run (BenchmarkLayoutFloor measures the
// three layouts bbolt allows): when each run has its own bucket, every
// commit of many runs rewrites, per run, the run's last leaf and the branch
// above it; with one bucket whose keys lead with a run number, fewer; when
// all events go to one append-only bucket, a commit rewrites the log's last
// leaves only, which is what many runs committed together need. So format
// 2 files (every file Open creates) keep:
//
//   - "log": every event, keyed by its ULID. The keys come from one
//     monotonic source per process and are minted after the run's tail, so
//     a run's keys only grow. Each value is a 28-byte link header — the
//     run's previous key (zero for its first event), the event's number in
//     its run, a CRC-32C over both and the key — then the sealed event.
//   - "starts": run id -> the run's first key, written once.
//   - "index": the run's first key -> its RunInfo entry (naming the run,
//     with the last key and count, sealed for the key it is filed under).
//     Filed by first key rather than run id, the entries of the runs being
//     driven — the newest — sit together at the index's end, where filed
//     by run id many runs' commits would rewrite the index leaves their
//     scattered ids fall in (BenchmarkTextAppend with finished runs). As
//     in the log, new keys come at the end, so its leaves are filled
//     whole: the fewer leaves hold the driven runs' entries, the fewer a
//     commit rewrites.
//     What it costs: the first-key record is how a run is found, the one
//     key that finds it by its id; lost, the run's entry is listed as
//     damaged under the run it names, and its events are not found
//     without a full scan. Damaged — a flipped bit in the id it is filed
//     under — the run is not taken for one never written: where its id
//     finds nothing, the 32 keys either side of where the id sorts are
//     looked at (the file check keeps a damaged key in order, where its
//     id was; runs started since with ids between the two are filed
//     between them), and one as long as the id, differing in a byte or
//     two, whose first event is the RunStarted of a run of that id, is
//     the run's. Load, Scan and LoadAfter then return ErrCorrupt naming
//     both ids and no events, Describe lists the run StatusCorrupt, and
//     an append that would start the run again, a fork onto or from it,
//     RequestCancel, RequeueRun and DeleteRun are refused with
//     ErrCorrupt. Runs lists the damaged key as a run of its
//     own, StatusCorrupt (its entry names another run). An id one bit
//     from another run's is no damage: that run's first event names it.
//   - "queue": run id -> the run's queue entry (see The queue; format 1
//     files keep it too).
//
// A run stays an ordered, ULID-keyed stream: Load (and Scan, which hands
// events over one at a time) walks the chain back from the index entry's
// last key, one point lookup per event, and checks every link: a missing
// event, a link that fails its checksum or numbers the event out of turn,
// a chain that does not start at the recorded first key, a count that does
// not match. Where the walk back cannot reach the run's first event (an
// event or the index entry damaged or gone), the links are also followed
// forward from the first key on record, so every event a link still
// reaches is returned beside the damage, as a bucket per run returns what
// it holds. Append checks that the index entry's last key is in the log
// and numbered last before minting after it, so a wrong entry cannot fork
// the chain. LoadAfter, for a reader following a run, walks back from the
// last key only to the last event the reader saw (and, when a step refers
// to a reply before it, to that reply), so a poll reads what is new; when
// that walk finds anything out of the way it reads as Load does. Deleting
// a run deletes every event its links reach. What the
// log costs: a resume reads by point lookups (BenchmarkResume), and a
// stream whose index entry and first-key record are both gone cannot be
// found without a full scan (in a bucket per run, deleting the bucket and
// the entry loses a run as silently).
//
// Files made before (format 1) keep their bucket per run, and new runs in
// them get buckets too, until Compact (polyloop-admin compact) moves them
// to the log: both layouts sit behind one interface (layout.go) and the
// damage tests run on both.
//
// # The queue
//
// The Store hands runs to a worker pool (seams.RunQueue) and keeps
// operators' cancel requests (seams.RunCanceller). One process holds a
// file for writing, so a hold lasts as long as the Store that took it:
// each Open has an Owner of its own (host, process id, a random suffix),
// and a queue entry naming another Owner was left by an Open that has
// ended — the file lock keeps a live one out.
//
// "queue" holds, by run id, an entry for every run started for an agent
// (RunStarted.Agent) and not finished, and for every run with a cancel
// request not carried out: the agent ("" for a run no worker claims), the
// Owner that claimed it, failures, last error, retry time and the cancel
// request, sealed with a CRC-32C over the fields and the run id. The
// append that starts an agent's run writes its entry, the append that
// finishes a run removes it, each in its own transaction; DeleteRun
// removes it with the run, and Compact copies it (a format 1 file's too).
// The queue changes no format version: a read-write Open adds the bucket
// to a file made before it, and read-only such a file has an empty queue.
// An agent name seams.ValidAgent refuses is refused at Append.
//
// ClaimRuns reads the queue, never the index or the log of every run, and
// writes this Store's Owner into the entries it takes, in one
// transaction, in run id order: entries of the named agents past their
// retry time, not claimed by this Store and still waiting for a driver,
// not held by a driver of this process, whose runs' index entries are
// sound and unfinished (an entry whose run finished or is gone — a
// version that kept no queue wrote it — is removed). A claim reserves
// each run (seams.RunLocks) while its transaction runs, so a driver
// starting meanwhile finds it taken rather than both taking it. LockRun
// reserves in this process only, so it succeeds for the Store that
// claimed the run; it ends the claim (the Store remembers its claims no
// driver has taken yet in memory): the run is held while its driver
// holds it, and nobody's once the driver lets go, so a worker claims it
// again — the claimer's too, when another driver of the process took the
// run first. ReleaseRun clears the claim in the file and sets the retry
// time (cleared for none: claimable at once), with a failure also
// counting it and keeping it (cut to 4 KiB), unless a driver of this process holds
// the run; a run started without an agent it leaves alone. RequeueRun
// clears claim, failures, last error and retry time, and refuses a run
// this Store claimed for a worker that has not taken it yet. A claim
// this Store made and no driver took (a worker that neither drove nor
// gave back what it claimed) stays until ReleaseRun, LockRun, the run's
// end or the Store's Close.
//
// Runs and Describe fill each run's agent, queue and holder and call
// seams.RunInfo.Liveness: held by a driver of this process or claimed by
// this Store and not taken yet, a run is running, with this Owner and no
// expiry; claimed by an ended Open, it names that Owner with LeaseExpires
// the time this Store was opened (that hold ended no later), so it reads
// interrupted; unheld (an entry naming this Owner whose driver let go
// included), an agent's run is awaiting and any other interrupted.
//
// CancelRequested never reads the file: the Store mirrors the file's
// cancel requests, loaded at Open and changed inside the transaction of
// every write of an entry, put back when that transaction does not
// commit; as no other process writes the file meanwhile, the mirror is
// the file. RequestCancel names this Owner as the holder while a driver
// of this process holds the run or this Store claimed it and no driver
// has taken it yet, else nobody.
//
// A damaged queue entry (it fails its checksum or does not decode) is
// damage in coordination, not in the run, and never stops anything for
// good: its agent and holder are unknown, so no claim takes it, Runs and
// Describe list the run interrupted with the damage in LastError,
// CancelRequested answers an error matching events.ErrCorruption (the
// engine then carries on as if no request was made) and ReleaseRun
// refuses it with ErrCorrupt. RequeueRun and RequestCancel write the
// entry anew, its agent read from the run's RunStarted (a cancel request
// the damaged entry held is lost); the run's end and DeleteRun remove it
// as any other. RequeueRun likewise writes the entry of an agent's run
// that has none (a file whose queue was lost).
//
// What does not live here: the rules of what a sound stream is (package
// recovery) and the views built from a stream (package projections).
package kv
