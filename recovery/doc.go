// Package recovery reads a run's log for resumption. Check applies the
// structural rules of a sound stream and returns a *CorruptError listing
// every broken rule, not just the first. Classify places the tail of a sound
// log in the recovery table — which side effect, if any, a crash left in
// doubt — and PlanFor says what Resume does about it. The engine's machine
// asks PlanFor too, so the table lives in one place. A Classifier is
// Classify one event at a time, for a reader that streams a run instead of
// holding it (engine.Resume over a seams.RunScanner); Classify is a loop
// over it, so both apply the same rules.
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
