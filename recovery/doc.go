// Package recovery reads a run's log: its fold and its verdict. Fold is the
// fold of a run's log, one event at a time (Apply) — the steps, the step in
// progress, the usage, the recorded result, where the tail stands (State)
// and what Resume does there (Plan). It is the one fold: the engine's
// machine is made of it, and the projections and readers present it. A
// Classifier is a Fold with the structural rules of a sound stream checked
// at each event; its Verdict is a *CorruptError listing every broken rule,
// not just the first, or the tail's place in the recovery table — which
// side effect, if any, a crash left in doubt — and the plan (PlanFor).
// Classify and Check are loops over a Classifier; engine.Resume applies a
// stream to its machine's Classifier as the store hands it over, so a long
// run is never held whole.
//
// # Torn tails and corruption
//
// bbolt transactions are atomic, so a crash never leaves half a record; what
// it leaves is a log that stops somewhere inside a step: an intent with no
// result, a reply with no step. That torn tail is expected, is classified,
// and can be resumed. Corruption is a log no crash could have produced — a
// result without its intent, a gap in the step indexes, a second
// RunStarted, events after RunFinished, a record that does not decode — and
// is refused.
//
// The recovery table:
//
//	model intent  model result  action intent  step completed  state               resume does
//	—             —             —              —               BetweenSteps        run the next step
//	✓             —             —              —               ModelCallUnknown    safe: call again, same result id; never: resume_state_unknown
//	✓             failure       —              —               KnownFailure        complete the step as llm_error
//	✓             reply         —              —               ReplyStored         re-parse the stored reply, no call
//	✓             reply         ✓              —               ActionUnknown       safe: execute again, same result id; never: resume_state_unknown
//	✓             reply         ✓/—            ✓               BetweenSteps        run the next step
//
// Human decisions (schema 1.5) add rows between the action intent and the
// step's completion. An action that needs approval gets an intent that
// awaits one (Intent.Awaits = approval): it is durable, with its result id,
// before anything could run, and the run waits. A person's Decision
// follows it; an approved action then gets a second intent of the same
// result id that awaits nothing — the intent proper, written right before
// the execution, so that a crash after it is an ordinary action in doubt
// and a crash before it is not:
//
//	action intent            decision          later intent       state               resume does
//	awaits approval          —                 —                  AwaitingApproval    wait for a decision: write nothing, return the pending call
//	awaits approval          approved          —                  Approved            check the (edited) arguments, write the intent, execute once
//	awaits approval          approved          ✓ awaits nothing   ActionUnknown       the approved action in doubt: by its policy, as above
//	awaits approval          rejected          —                  Rejected            complete not_executed: "rejected by reviewer: <note>"
//	awaits nothing (doubt)   —                 ✓ awaits resol.    AwaitingResolution  wait for an operator's finding: write nothing
//	awaits nothing (doubt)   executed|not_ex.  ✓/—                Resolved            complete the step as found, executing nothing
//
// Approved is not in doubt: its executing intent is not written, so the
// action has not started (the driver writes that intent and only then
// executes). A never action in doubt stops the run resume_state_unknown,
// as before — unless the run's request asks that it await a resolution
// (engine.Request.AwaitResolution, the snapshot's await_resolution, which
// Fold.Plan reads): Resume then writes the awaiting-resolution intent
// (PlanAwaitResolution) and waits.
// A finding is accepted on any action in doubt (ActionUnknown, whatever
// its policy, or AwaitingResolution); an approval's answer only while the
// action awaits approval; each once. What a step completes with must be
// what its decisions allow: nothing completes while awaiting; an action
// whose executing intent was never written completes not_executed; a
// resolved one completes as found. A run may finish cancelled in any of
// these states, and resume_state_unknown where the stored reply no longer
// parses to the action its intent announced.
//
// A forked run's log (engine.Fork) begins with RunStarted and the prefix
// copied from its source, whose events name the run that first wrote
// them (RunStarted.Fork says which, step by step: ForkOrigin.RunOfStep);
// they are accepted as the run's own inside that prefix only, and a log
// that ends inside it is corrupt — the copy is one transaction.
//
// What does not live here: replaying a log and continuing the run (package
// engine), and reading it from disk (package kv).
package recovery
