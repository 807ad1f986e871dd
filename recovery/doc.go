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
// What does not live here: replaying a log and continuing the run (package
// engine), and reading it from disk (package kv).
package recovery
