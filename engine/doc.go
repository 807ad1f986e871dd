// Package engine runs agents: Definition (what stays the same across runs:
// model, parser, store, sink), Request (one run's goal, budget, tools and
// policies), Run and Resume, and RunOrResume, which continues a run or
// starts it; Start, Cancel, Decide and Resolve operate a run from outside
// the process that drives it; Fork starts a run from a prefix of another.
//
// # Machine, commands, driver
//
// The loop is split the way etcd's raft is. machine.go is a pure reducer: it
// takes inputs (a durable append, a model return, an action return, a
// replayed event, each carrying the time, a fresh id and whether the run was
// cancelled, all observed by the driver) and returns one command: append
// these events, call the model with this ModelCall, execute this action, or
// done. It reads no clock, mints no ids and does no I/O. driver.go carries
// the commands out against the seams, and is the only place with a context,
// a clock and an id source. The ordering rule the driver keeps: an append's
// events are durable before the machine is told, and the machine asks for a
// side effect only after the intent announcing it was reported durable.
//
// # One step
//
// Stop checks (cancellation, step budget, action budget); prompt assembly
// (run-level messages, injections, the tool section, goal-level messages,
// then history; prompt_chars in code points; over the budget stops with
// context_overflow before any call); a durable model intent; the model call;
// its durable result; parsing (an invalid decision, a final answer, a tool
// call the registry rejects, or an action); a durable action intent; the
// action; a durable StepCompleted; stop checks after the step.
//
// # Two durable transactions per step
//
// Between two side effects there is nothing to protect, so events that
// follow one another with no side effect between them are appended in one
// transaction: the model result with the action intent, the step record with
// the next model intent. A step then costs two durable writes, one before
// each side effect, which is the floor. Request.OneEventPerTransaction turns
// this off so tests can stop a run at every event.
//
// # Resume
//
// Resume loads the log, refuses a corrupt one (package recovery), returns a
// finished run's recorded result without writing, refuses a run whose
// parameter snapshot changed (listing every key), and otherwise replays the
// log through the same machine and continues from the tail by the recovery
// table. History is rebuilt from the log, so the model sees exactly the
// messages the uninterrupted run would have sent.
//
// # One driver per run
//
// Run and Resume take the store's run lock when it has one
// (seams.RunLocker; kv and MemStore do), so a second driver in the same
// process fails with ErrRunBusy before it replays the run, calls the model
// or executes anything. Resume takes it only once it knows the run has a
// log (seams.RunFinder, or the stream's first event; a run with none is
// ErrRunNotFound without the lock), so the id of a run that does not exist
// is held only by a Run starting it, and a Run turned away by the lock
// fails with an error matching ErrRunExists as well as ErrRunBusy; so does
// a Run whose first append finds that another driver started the run
// meanwhile (a store whose reservations live on the run's own record, such
// as pgstore's leases, cannot reserve a run that has none yet).
//
// A store's reservations may be leases that expire (seams.RunLeaser:
// pgstore's, across processes). A driver paused past its lease — a
// stopped process, a partition — may find another driving the run when it
// wakes, so before every model call and every side effect the driver asks
// the store whether it still holds the run; when it does not, or cannot
// tell, it stops there, calling and executing nothing more, and returns
// ErrRunBusy (or the store's error; the run stays resumable). The guarantee does not rest on the lock: the driver
// names, on every append, the tail it holds (seams.RunStore.Append), and an
// append whose tail moved fails; the driver then stops at once, executes
// nothing more and returns ErrRunBusy. Of two drivers continuing one tail,
// in one process or many, exactly one continues the run. What the tail
// rule alone cannot prevent, across processes, is two drivers both
// replaying a side effect declared safe from the same tail before one of
// them loses: that is what safe means. A never side effect is always
// announced by an intent the driver itself made durable, so it runs at most
// once.
//
// # Cancellation
//
// Cancelling ctx interrupts model calls and actions, and no side effect is
// started once the cancellation is seen. An append is never abandoned
// because of the cancellation: its events may record a side effect that
// already happened (a reply, an action's outcome), and dropping them would
// turn a known outcome into one in doubt. Every append therefore gets a
// context detached from ctx that ends CancelGrace after ctx ends (not only
// the write of RunFinished{cancelled}, as the first design had it): a queued group-commit append is not withdrawn because the run was
// cancelled. If the grace runs out, Run returns an error saying which
// events were not durable and that the run can be resumed.
//
// A run may also be cancelled from outside the process that drives it:
// Cancel records an operator's request in a store that keeps them
// (seams.RunCanceller), and the driver, which asks the store as it
// observes every input, cancels the run's context itself once it sees
// one — so a request recorded before an action's intent was durable is
// seen before the action runs, and the run ends cancelled as above. A run
// nobody holds is ended by Cancel at once, after its log is checked.
//
// # Interruption is not cancellation
//
// Definition.Interrupt stops a run at its next step boundary, where
// nothing is in doubt: the step in progress completes, its side effect
// included, no model call is announced, nothing is written for the stop,
// and Run or Resume return ErrInterrupted; Resume later continues from
// the same place. It is how a worker (package worker) shuts down without
// ending its runs. A run that would stop anyway at that boundary (a
// budget, a final answer) finishes. Start uses it to write a run's
// RunStarted alone (a submitted run, which a worker drives).
//
// # Human decisions
//
// An action may need a person's approval before it runs: every call of a
// tool whose spec says so (seams.ToolSpec.RequiresApproval), or the calls
// a request's seams.ApprovalPolicy picks from the tool name and arguments
// ("refunds over 100"); both are part of the parameter snapshot. Such an
// action gets its durable intent as every side effect does — with its
// pre-allocated result id, the call's arguments and the tool's schema —
// marked as awaiting approval, and Run or Resume returns at once: nothing
// is held, the process may exit, the machine may be replaced. Decide
// records the person's decision as a durable event (who, an optional
// note, and for an approval optionally edited arguments, checked against
// the schema the intent recorded) after the log's tail, under the same
// tail rule as every append and needing no driver. Resume then continues:
// an approved action gets its intent proper — same result id, awaiting
// nothing — and only then runs (a crash after that intent leaves an
// ordinary action in doubt under its replay policy; a crash before it
// leaves an approved action that has not started, which the next Resume
// runs: once, ever); a rejected one completes not_executed, the model
// told "rejected by reviewer: <note>", and the run goes on.
//
// A run that waits for a person is not finished and not stopped, so it
// has no stop reason (the ten stay as they are) and no RunResult: Run and
// Resume return an *AwaitingError (ErrAwaitingDecision) listing the calls
// that await a decision. An error, not a result field, because a result
// means the run stopped — a caller who reads a RunResult's stop reason
// without looking at its error would take a waiting run for a finished
// one — while an error is what a caller must handle before going on, as
// ErrInterrupted is for a run stopped unfinished.
//
// A side effect left in doubt by a crash (a never action whose outcome is
// unknown) ends the run resume_state_unknown, as before, unless a person
// settles it: Resolve records an operator's finding — executed, with what
// they saw of its effect, or not executed — on a run nobody drives whose
// tail is that action, and Resume completes the step as found, never
// executing the action. Since a resume (a worker's included) ends such a
// run at once, Request.AwaitResolution makes the run wait for a finding
// instead, exactly as for an approval. recovery/doc.go has the rows.
//
// In a StepRecord a decision shows where the eighteen fields already say
// it: tool_arguments are the arguments that ran (an approval's edited
// ones), a rejected step's observation is "rejected by reviewer: <note>"
// and its action_status not_executed, a resolved step's observation the
// operator's (observation_is_synthetic: the executor did not produce it);
// who decided, when and the note live in the Decision event of the
// stream and in projections.RunLog's Decisions. step_wall_ms includes the
// wait for the decision.
//
// # Fork
//
// Fork starts a new run from a verified prefix of another — its steps
// 0..k-1 — and drives it under a definition and request of its own: the
// question "what if, at step k, it had used the other model?" asked of
// the same history. The prefix is copied by the store in one transaction,
// each event's payload as the source stored it (naming the source, or
// the ancestor that first wrote it), under the fork's keys; its
// RunStarted says where it came from and lists the parameters that
// differ, recorded rather than refused, since differing is the point.
// The copied steps are history: the machine replays them as Resume
// replays a log, so nothing in them runs again, and a fork never starts
// inside a step (the prefix ends where step k-1 completed); what it does
// first is a new model call, unless the copied steps already call for a
// stop. The fork's history is the source's as the source's model saw it.
//
// The source's side effects after step k happened in the world, and the
// fork knows nothing of them: its model never sees them, and they are
// not undone. An action the source executed after k — a never one above
// all (a payment, an email) — may be executed again by the fork if its
// model decides so, under a result id of its own: the fork is a new run,
// not a replay. Fork is for asking what a run would have done; to
// continue a run, Resume it.
//
// # Choices worth knowing
//
//   - Every observation fed back to the model, a parse failure's explanation
//     included, is wrapped in ObservationTemplate; StepRecord.Observation is
//     that wrapped text. The llm_error step's synthetic text is not wrapped:
//     it is never fed back.
//   - A tool call when Request.Tools is nil is rejected like an unknown tool.
//   - Every text a consumer's seams hand a run is bounded before it is
//     stored, so every event stays under events.MaxPayload and what a run
//     writes it reads back. A model reply larger than events.MaxTextBytes
//     (content, thinking and call id together) is a failed model call
//     (llm_error, nothing executed, the failure saying why; its usage is
//     not recorded, there being no reply); a parser's history text, final
//     answer, action or tool arguments larger than it, or a tool name over
//     1 KiB, make the decision invalid (an action is never cut: what runs is
//     what the model said, or nothing); an explanation (a parser's panic
//     included), a model client's error and an observation (a rejected tool
//     call's included) are cut to it at a UTF-8 boundary, an observation's
//     cut code points added to observation_truncated_chars; an executor's
//     env_error cause is cut to events.MaxEnvErrorBytes. The synthetic
//     texts and ObservationTemplate are validated against it.
//   - Resuming a stored reply that no longer parses to the action its
//     intent announced (a log written under other bounds) executes nothing
//     and stops with resume_state_unknown.
//   - step_wall_ms runs from the moment the step's model intent was durable
//     (its ULID time) to the StepCompleted, so it survives a resume.
//   - Injected entry ids are recorded in the parameter snapshot
//     (injections.<channel> = the ids in order), not in the trajectory: the
//     StepRecord has exactly eighteen frozen fields, and the ids are the same for every
//     step of a run, so a per-step copy would only repeat them; and in the
//     snapshot they do work — resuming with other skills would send the
//     model a different prompt than the crashed run's, which Resume refuses
//     like any other changed parameter.
//   - A run cancelled while a side effect is in flight, whose model client
//     or executor then returns an error, finishes with that intent
//     unanswered: the call was interrupted, and whether it partly happened
//     is not known — the unanswered intent says exactly that. recovery
//     accepts it for cancelled and resume_state_unknown. A side effect that
//     returns its outcome is always recorded, cancelled or not.
//   - A run has one result: the one stored in RunFinished, which Run
//     returns, Resume of the finished run returns and the projections
//     rebuild. Its EventDeliveryFailures counts the sink failures of the
//     events delivered before the run's final append; the events of that
//     append (RunFinished among them) are delivered once it is durable, too
//     late to be counted in it. A resumed run counts the resuming process's
//     deliveries.
//   - environment-reported completion ends a run (task_completed) only when
//     the action was executed: task_completed means an action ran and the
//     goal is reached, so a not_executed or env_error outcome claiming
//     completion does not.
//
// What does not live here: storage (kv), the event vocabulary (events), the
// fold of a log and its structural rules (recovery) and the views of a log
// (projections). The engine imports no store: it knows one only through
// the seams, which make check holds it to (deps_test.go).
package engine
