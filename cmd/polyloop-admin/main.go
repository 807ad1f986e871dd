// Command polyloop-admin changes a PolyLoop store: it cancels and resumes
// runs, records people's decisions on calls that await them (from the
// command line, or from the run viewer's pages it serves), forks demo
// runs, deletes runs and compacts files. (polyloop-inspect only reads; the writing verbs live
// here, in a command named for them.)
//
//	polyloop-admin cancel [--by NAME] STORE RUN...        cancel runs, whoever drives them (engine.Cancel)
//	polyloop-admin resume STORE RUN...                    hand interrupted agent runs back to the workers (seams.RunQueue.RequeueRun)
//	polyloop-admin approve [--by NAME] [--note TEXT] [--arguments JSON] STORE RUN CALL
//	                                                      approve a call awaiting approval, its arguments edited or not (engine.Decide)
//	polyloop-admin reject [--by NAME] [--note TEXT] STORE RUN CALL
//	                                                      reject it: it never runs, the model is told the note (engine.Decide)
//	polyloop-admin resolve [--by NAME] [--note TEXT] (--executed --observation TEXT | --not-executed) STORE RUN CALL
//	                                                      an operator's finding on an action a crash left in doubt (engine.Resolve)
//	polyloop-admin serve [--addr ADDR] [--hosts H,…] --by NAME STORE
//	                                                      the run viewer, recording decisions made on its pages by NAME (viewer.Options.Decide)
//	polyloop-admin delete [--force] [--dry-run] [--json] STORE RUN...
//	                                                      delete finished runs (--force: unfinished too)
//	polyloop-admin gc --finished-before 720h [--dry-run] [--json] STORE
//	                                                      delete finished runs whose last event is older
//	polyloop-admin compact STORE                          rewrite a bbolt file without its free pages, in the current format
//	polyloop-admin fork [--reply TEXT]... STORE SOURCE STEP NEWID
//	                                                      fork a polyloop-demo run at STEP onto NEWID (engine.Fork), its model replying TEXT from STEP on
//	polyloop-admin --version                              the module version and VCS revision it was built from
//
// STORE is a bbolt file or a PostgreSQL connection string (a postgres://
// URL or a key=value string). cancel and resume need a store that keeps
// cancel requests (seams.RunCanceller) and a queue of runs for workers
// (seams.RunQueue); --by names who cancels or decides, user@host by
// default but for serve, which needs it. serve answers only to localhost
// and loopback addresses unless --hosts names others. CALL is the id of the call that waits (polyloop-inspect verify
// STORE RUN names it). delete and gc name each run they delete and each
// they leave alone, and why; --dry-run says what they would delete,
// opening the store read-only (retention.Check, retention.Preview); --json prints one
// object per run (run_id, action, reason), a run the store failed to
// delete included (action "error"). Exit status: 0 done, 1 a problem (a run or a
// decision refused, the store unreadable or without what the command
// needs), 2 bad usage.
package main

import (
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
