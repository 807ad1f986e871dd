// Package events is the vocabulary PolyLoop persists: the six event records
// of a run's stream (RunStarted, Intent, ModelCallResult, StepCompleted,
// RunFinished, and since 1.5 Decision), the value types embedded in them (StepRecord, RunResult,
// ModelReply, ActionOutcome and the frozen enums), the Envelope every stored
// value travels in, and the msgpack codec that carries a schema version.
//
// # Wire format
//
// A stored value is a msgpack map {"kind", "schema_version", "payload",
// "crc"} — the payload compressed under "payload_z" (1.2) or "payload_s2"
// (1.3) instead, and followed by "refs" when it refers to earlier events
// (1.3; see below); the payload is a msgpack map with snake_case keys (the names JSON uses too),
// never a positional array, so a later minor version may add fields that an
// older reader ignores. The Envelope's ULID is the storage key and is not
// repeated inside the value. Decoding refuses, with a *DecodeError naming the
// problem, a value whose schema version is missing (a default never stands in
// for it), whose major version is unknown, whose kind is unknown, or whose
// payload does not match its kind.
//
// # Checksums (schema 1.1)
//
// Every value ends with a last field, "crc": a msgpack uint32 holding the
// CRC-32C (Castagnoli, the checksum of pebble's record format and etcd's
// WAL) of the run id (length first), the key, and every byte of the value
// before the checksum — so it covers the kind, the schema version and the
// payload, and a value moved under another key or into another run fails
// too. Marshal leaves it zero; the store calls Seal once it has minted the
// key, and Unmarshal verifies it (ErrChecksum). bbolt checksums only its
// meta pages; without this, a flipped bit in a page would read back as a
// different observation, tool argument or result id. Values of schema 1.0,
// written before, carry no checksum and are read as they are; a value of
// 1.1 or later without one is refused. Nested schema versions (a step
// record's, a result's, run_started's) must be present and of a known major.
//
// # Schema 1.2
//
// 1.2 adds, each optional and absent in older values: a reply's token
// usage (ModelReply.Usage), an env_error's cause (ActionOutcome.EnvError),
// the stop reason token_budget, and compression: a payload of 1 KiB or more
// may be stored as "payload_z", the payload's msgpack bytes zstd-compressed
// (when that saves an eighth), in place of "payload". The checksum covers
// the stored bytes; decompression is bounded (64 MiB) and its result is
// walked like any payload.
//
// # Schema 1.3
//
// 1.3 changes how a large payload is compressed: "payload_s2", an S2 block
// (github.com/klauspost/compress/s2), in place of 1.2's zstd payload_z,
// which is still read. S2 costs a fifth of zstd's CPU on a step's texts,
// which is what 64 concurrent runs on two cores lacked (see envelope.go).
// An S2 block declaring more than the 64 MiB bound is refused before
// anything is allocated for it.
//
// The same bound, MaxPayload, holds when writing, whether or not the
// payload compresses: Marshal refuses a larger payload with ErrTooLarge,
// so a store never accepts what it would not read back. MaxTextBytes is the
// engine's share of it for each text a consumer hands a run.
//
// 1.3 also stores each of a step's texts once: a compressed StepCompleted
// may leave step.raw_output, step.action and step.observation empty and
// say in the envelope's "refs" that they are the run's latest reply, a
// part of the raw output, and the outcome's observation wrapped (refs.go).
// Readers see the fields as written; decoding such a value outside its
// stream fails with ErrNeedsStream. A step of a 2 KB reply and a 4 KB
// observation takes 0.94x its payload on disk (1.36x with the same
// compression and no references).
//
// # Schema 1.5
//
// 1.5 records human decisions. An action intent may await a person
// (Intent.Awaits: approval before the action runs, or resolution of an
// outcome a crash left in doubt) and then carries the call's arguments
// and the tool's parameter schema as JSON text, so a person or a program
// can see, edit and check the call from the log alone. A sixth record,
// Decision, is the person's word on it: approved (optionally with edited
// arguments) or rejected, or the finding executed (with an observation) or
// not_executed; who made it is an opaque name, when is its envelope's time.
// An intent that awaits nothing is encoded as 1.4 encoded it.
//
// # Schema 1.6
//
// 1.6 records forks: a run started from a verified prefix of another
// carries RunStarted.Fork (the source run, the step forked at, the key of
// the source's last event copied, the parameter differences). The copied
// events follow its RunStarted, their payloads as the source stored them
// — naming the source run — resealed under the fork's run id and keys.
// A run that is no fork is encoded as 1.5 encoded it.
//
// Decoding first walks the value without recursion (a stack of counts),
// proving every declared length is backed by bytes and that nothing nests
// deeper than 32 levels, so a damaged value can neither make decoding
// allocate far beyond its size nor exhaust the stack.
//
// DamageError is how a store reports a stream it could not load whole: the
// problems (decode errors naming each key, events missing) beside the
// events that did decode; package recovery lists them as corruption.
// ErrCorruption is the one corruption marker: a DamageError, kv's and
// pgstore's ErrCorrupt and recovery's all match it, so "is this damage?"
// is one errors.Is whatever the store.
//
// # Absent values
//
// Fields that may be absent are pointers in StepRecord and
// RunResult and are exported as JSON null. ModelReply.CallID uses the empty
// string for "absent": an empty string is never a valid call id, so the two
// cannot be confused, and an absent id is left out of the wire map (the key
// is omitted), which an older reader decodes as absent too.
//
// What does not live here: how events are stored (package kv), how streams
// fold into views (package projections), and how a run produces them
// (package engine). This package imports nothing else of PolyLoop's.
package events
