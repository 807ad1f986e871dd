// Package events is the vocabulary PolyLoop persists: the five event records
// of a run's stream (RunStarted, Intent, ModelCallResult, StepCompleted,
// RunFinished), the value types embedded in them (StepRecord, RunResult,
// ModelReply, ActionOutcome and the frozen enums), the Envelope every stored
// value travels in, and the msgpack codec that carries a schema version.
//
// # Wire format
//
// A stored value is a msgpack map {"kind", "schema_version", "payload"}; the
// payload is a msgpack map with the snake_case keys of the specification,
// never a positional array, so a later minor version may add fields that an
// older reader ignores. The Envelope's ULID is the storage key and is not
// repeated inside the value. Decoding refuses, with a *DecodeError naming the
// problem, a value whose schema version is missing (a default never stands in
// for it), whose major version is unknown, whose kind is unknown, or whose
// payload does not match its kind.
//
// # Absent values
//
// Fields the specification allows to be absent are pointers in StepRecord and
// RunResult and are exported as JSON null. ModelReply.CallID uses the empty
// string for "absent": an empty string is never a valid call id, so the two
// cannot be confused, and it is written to the wire as nil.
//
// What does not live here: how events are stored (package kv), how streams
// fold into views (package projections), and how a run produces them
// (package engine). This package imports nothing else of PolyLoop's.
package events
