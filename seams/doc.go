// Package seams holds the five interfaces through which a consumer plugs into
// PolyLoop (ModelClient, DecisionParser, ActionExecutor, RunStore,
// EventSink), the shapes passed through them (ModelCall, Message, ParsedReply,
// the closed Decision sum, ActionCall, ToolCall), and the immutable tool
// Registry that turns tool functions into an ActionExecutor.
//
// Every seam reports Parameters(): synchronous, no I/O, only the settings
// that change behaviour (never a file path or a credential). The engine
// stores them, prefixed, in the run's parameter snapshot, and Resume refuses
// to continue a run whose seams changed.
//
// # Shapes worth knowing
//
// ActionExecutor.Execute takes an ActionCall, not a bare Action: the call
// carries the run id, step index and the pre-allocated result id, exactly as
// ModelCall does for the model, so an executor can make a replayed side
// effect idempotent (the result id is the same on a replay). Tool handlers,
// which take only their arguments, read the same call with CallOf(ctx).
//
// RunStore.Append names the tail it continues (the id of the last event the
// caller has seen; zero for a new run) and fails with ErrTailMoved, writing
// nothing, when the stream's tail is another: optimistic concurrency, as
// event stores keep it, so two drivers can never both continue one run, in
// one process or in many sharing a store. CheckAppend is the one function
// every store applies; proptest.RunStoreContract proves a store obeys it.
// A store may also implement RunLocker (RunLocks is the in-process one to
// embed), which lets the engine refuse a second driver before it replays a
// side effect declared safe; the tail rule is the guarantee, the lock a
// courtesy. A RunLeaser's reservations are leases that can be lost (a
// shared store's, across processes): the engine asks HoldsRun before every
// model call and side effect, and proptest.RunLeaseContract proves how
// reservations behave among drivers. A store may implement RunScanner, which hands a run's events
// over one at a time, so Resume never holds a long run's stream whole;
// RunTailer, which reads what follows the events a reader has seen, so a
// follower reads what is new (LoadAfter falls back to
// Load for stores without it); RunFinder, which says whether a run has a
// log without reading it (engine.Resume asks before it takes the run's
// lock); and RunDeleter, which deletes finished runs (package retention).
//
// What does not live here: implementations of the seams (kv.Store is the
// bbolt RunStore; seams/seamstest holds test doubles) and the loop that
// drives them (package engine).
package seams
