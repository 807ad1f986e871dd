// Package proptest holds PolyLoop's reusable test harnesses and its
// property tests.
//
// Exported, for any test: RunStoreContract, the contract suite every
// seams.RunStore implementation runs against itself (RunTailerContract
// within it, for a seams.RunTailer); RunDeleterContract, the same for
// seams.RunDeleter; RunLeaseContract, how run reservations behave among
// several drivers; RunQueueContract, the rules of a worker pool's queue
// (seams.RunQueue, seams.RunCanceller, seams.RunDescriber) that every
// QueueStore keeps alike; RunForkerContract, the rules of
// seams.RunForker (a fork's copy, its refusals, its listing, its tail and
// its latest reply) for every ForkStore; CorruptionContract, how a store reports each kind of
// damage it can suffer; AppendEach, a stream written event by event;
// SoundStream, FailedModelCall and DecidedSteps, sample streams holding
// every record shape (DecidedSteps: steps approved with edited
// arguments, rejected, and found executed by an operator);
// LongReplyStream, a sound stream whose first step a store may keep as a
// reference to its reply; CrashingStore, a store that dies at its
// n-th append (crashstore.Store, pebble's errorfs pattern); SameSteps,
// trajectory equality with timing aside; FollowPoll, a benchmark of a
// follower's poll on any seams.RunTailer. What knows bbolt's file format —
// the damage corpus, the raw bbolt floor of the benchmarks — is kv's
// (kv/kvtest): the harnesses import no store, only the tests do.
//
// Its own tests are the recovery promise, checked with pgregory.net/rapid:
// generated runs crashed at every write — on MemStore, kv and PostgreSQL
// (when a server is at hand, pgstore/pgtest), the resume
// crashed again and cancelled — and resumed (TestPropertyCrashAtEveryWrite);
// generated runs whose actions wait for people's decisions (approve, edit,
// reject) and for operators' findings on actions in doubt, crashed at
// every write, decisions' included, and held to the tools' own ledger
// (TestPropertyDecisionsSurviveCrashes); forks of generated runs at every
// step, under the same replies and other ones, forks of forks, forks
// racing their source, and forks crashed at every write and resumed, held
// to the tools' own ledger (TestPropertyAForkRetracesItsSource,
// TestPropertyAForkRacingItsSourceCopiesAConsistentPrefix,
// TestPropertyAForkSurvivesACrashAtEveryWrite; the first and the last at
// half the checks, a tenth under the race detector: each check forks
// tens of times); the rules of seams.RunForker (RunForkerContract);
// 2–4 drivers racing on one run (TestPropertyOneDriverPerRun); damaged logs
// refused or resumed soundly, damage no sound log can hold always refused
// (TestPropertyDamagedLogsAreRefusedOrResumedSoundly,
// TestPropertyDamagedBytesAreAlwaysRefused); a real process killed with
// SIGKILL mid-run and resumed (TestRealCrashSIGKILL; on PostgreSQL two
// processes then race to resume, TestRealCrashSIGKILLPostgres); and the damage corpus
// opened in child processes (TestDamageCorpus; make damage runs all of it).
// CI runs 1,000 generated runs per property (TestPropertyDecisionsSurviveCrashes
// a quarter of them under the race detector); make prop runs 100,000.
//
// Nothing here runs in production code paths: no command or example links
// it (the root's deps_test.go checks).
package proptest
