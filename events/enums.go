package events

// ReplayPolicy says whether a side effect may be performed again, with the
// same result id, when a crash left its outcome unknown.
type ReplayPolicy string

const (
	// ReplayNever forbids a second attempt: an unknown outcome stops the run
	// with StopResumeStateUnknown. It is the default for tools.
	ReplayNever ReplayPolicy = "never"
	// ReplaySafe allows the side effect to be performed again.
	ReplaySafe ReplayPolicy = "safe"
)

// Valid reports whether p is one of the frozen values.
func (p ReplayPolicy) Valid() bool { return p == ReplayNever || p == ReplaySafe }

// IntentKind names the side effect an Intent announces.
type IntentKind string

const (
	// IntentModelCall precedes a call to the model.
	IntentModelCall IntentKind = "model_call"
	// IntentAction precedes the execution of an action.
	IntentAction IntentKind = "action"
)

// Valid reports whether k is one of the frozen values.
func (k IntentKind) Valid() bool { return k == IntentModelCall || k == IntentAction }

// ActionStatus is what became of an action.
type ActionStatus string

const (
	// StatusExecuted: the executor ran the action and returned an outcome.
	StatusExecuted ActionStatus = "executed"
	// StatusNotExecuted: the action was rejected before execution (unknown
	// tool, invalid arguments).
	StatusNotExecuted ActionStatus = "not_executed"
	// StatusEnvError: the executor failed or panicked.
	StatusEnvError ActionStatus = "env_error"
)

// Valid reports whether s is one of the frozen values.
func (s ActionStatus) Valid() bool {
	return s == StatusExecuted || s == StatusNotExecuted || s == StatusEnvError
}

// Awaits says what an action intent waits for (Intent.Awaits).
type Awaits string

const (
	// AwaitsApproval: the action runs only once a person approves it.
	AwaitsApproval Awaits = "approval"
	// AwaitsResolution: the action's outcome is in doubt and the run
	// waits for an operator's finding.
	AwaitsResolution Awaits = "resolution"
)

// Valid reports whether a is one of the values.
func (a Awaits) Valid() bool { return a == AwaitsApproval || a == AwaitsResolution }

// Verdict is a Decision's word: approved or rejected for an action
// awaiting approval, executed or not_executed for an operator's finding
// on an action in doubt.
type Verdict string

const (
	VerdictApproved    Verdict = "approved"     // run the action
	VerdictRejected    Verdict = "rejected"     // do not run it; the model is told
	VerdictExecuted    Verdict = "executed"     // it ran; Decision.Observation is what it did
	VerdictNotExecuted Verdict = "not_executed" // it did not run
)

// Valid reports whether v is one of the values.
func (v Verdict) Valid() bool {
	return v == VerdictApproved || v == VerdictRejected || v == VerdictExecuted || v == VerdictNotExecuted
}

// Resolves reports whether v is an operator's finding on an action in
// doubt (executed, not_executed) rather than an approval's answer.
func (v Verdict) Resolves() bool { return v == VerdictExecuted || v == VerdictNotExecuted }

// StopReason says why a run stopped. The ten strings are frozen: downstream
// statistics group trajectories by them.
type StopReason string

const (
	// StopTaskCompleted: an action was executed and the goal is reached (the
	// environment said so, or the executed tool is marked completes_run).
	StopTaskCompleted StopReason = "task_completed"
	// StopStepBudget: Budget.MaxSteps steps were taken.
	StopStepBudget StopReason = "step_budget"
	// StopParseFailedRepeatedly: Budget.MaxConsecutiveParseFailures parse
	// failures in a row.
	StopParseFailedRepeatedly StopReason = "parse_failed_repeatedly"
	// StopContextOverflow: the prompt would exceed Budget.MaxPromptChars; the
	// model was not called.
	StopContextOverflow StopReason = "context_overflow"
	// StopEnvError: the executor failed or panicked.
	StopEnvError StopReason = "env_error"
	// StopLLMError: the model call failed.
	StopLLMError StopReason = "llm_error"
	// StopAgentFinished: the model gave a final answer; the environment was
	// never consulted.
	StopAgentFinished StopReason = "agent_finished"
	// StopActionBudget: Budget.MaxActions actions were executed.
	StopActionBudget StopReason = "action_budget"
	// StopCancelled: the caller's context was cancelled.
	StopCancelled StopReason = "cancelled"
	// StopResumeStateUnknown: a crash left a side effect whose replay policy
	// is never in an unknown state; resuming would risk doing it twice.
	StopResumeStateUnknown StopReason = "resume_state_unknown"
)

// StopTokenBudget: Budget.MaxTotalTokens was reached before a model call.
// It was added after the ten frozen reasons and is reachable only when
// that budget is set; StopReasons keeps the ten.
const StopTokenBudget StopReason = "token_budget"

// StopReasons lists the ten frozen stop reasons in their documented order.
var StopReasons = [...]StopReason{
	StopTaskCompleted, StopStepBudget, StopParseFailedRepeatedly,
	StopContextOverflow, StopEnvError, StopLLMError, StopAgentFinished,
	StopActionBudget, StopCancelled, StopResumeStateUnknown,
}

// Valid reports whether r is one of the ten frozen values or an added one
// (StopTokenBudget).
func (r StopReason) Valid() bool {
	if r == StopTokenBudget {
		return true
	}
	for _, v := range StopReasons {
		if r == v {
			return true
		}
	}
	return false
}
