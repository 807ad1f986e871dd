// Package kv is the bbolt implementation of seams.RunStore: one file, one
// nested bucket per run under a root bucket, monotonic ULID keys, msgpack
// envelope values, and an index bucket kept in the same transaction that
// lists runs without scanning their streams.
//
// # Basics
//
// Open a file with Open; share the *Store between all runs of a process; Close
// it when done. Append writes one call's events in one transaction and
// returns once they are durable. Load returns a run's stream; a run never
// written is an empty stream and no error. Runs lists the index.
//
// # Group commit
//
// Appends from concurrent runs are group-committed, leader-style: an
// appender that finds no commit in progress becomes the leader and commits,
// in its own goroutine, every append queued at that moment in one bbolt
// transaction, so one fsync serves them all; each caller returns only when
// the transaction holding its events is durable. The leader then hands
// leadership to the oldest waiting appender. A lone append never waits for
// company and never hands off to another goroutine: it commits at once.
// (bbolt's own Batch waits up to MaxBatchDelay for company, which makes a
// lone run's durable write many times slower.) A refused append in a group
// does not affect the others: the rules of seams.CheckAppend are checked
// against the index before anything of that append is written; a failure
// after an append began writing (bbolt's own) rolls the whole group back,
// so an append is all or nothing. If ctx ends before an append was taken
// into a transaction, it is withdrawn and nothing of it is written (the
// engine passes appends that must not be lost a context detached from the
// run's, see engine's doc on cancellation).
//
// # Tails and keys
//
// Append checks the tail its caller names against the run bucket's last
// key inside the writing transaction, so appends grouped into one
// transaction see each other and of two continuing one tail exactly one
// wins. Keys are ULIDs minted after that last key (events.IDSource.
// NextAfter), whatever the clock says: after a process wrote with its clock
// ahead (an NTP step, a VM migration, a restored snapshot), the run's next
// keys carry the future millisecond, incremented, until the clock catches
// up. What that leaves behind: event times read from keys (Envelope.Time,
// RunInfo's first/last event) show the future moment, and step_wall_ms of
// steps written meanwhile reads 0. Other runs are not affected. The Store
// also embeds seams.RunLocks, so one process runs one driver per run; the
// file lock keeps other processes out.
//
// The freelist is not written on each commit (bbolt's NoFreelistSync; it is
// rebuilt when the file is opened): it saves a page write per commit.
//
// # Caveats
//
// The file is locked while open; a second Open (from this or another process)
// waits Options.LockTimeout and then fails with ErrLocked. Read-only opens
// share the lock with other readers. A damaged or truncated file yields
// ErrCorrupt (or a decoding error), never a panic: bbolt page faults on a
// truncated mapping are turned into errors with debug.SetPanicOnFault.
//
// What does not live here: the rules of what a sound stream is (package
// recovery) and the views built from a stream (package projections).
package kv
