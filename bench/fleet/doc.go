// Package fleet benchmarks PolyLoop's PostgreSQL store beside a peer,
// DBOS Transact Go, and beside the raw pgx floor, on one PostgreSQL server
// and one workload: runs of 50 steps, each step a 2 KB model reply holding
// an action and a 4 KB observation, with no model delay.
//
// It is a module of its own (bench/fleet/go.mod, which replaces PolyLoop
// with the tree it sits in) so that the library's go.mod never depends on
// the peer: the root module's ./... stops at this directory. The package
// holds nothing but its benchmarks and the test that checks their
// workloads; README.md says how to run them and what each name measures.
package fleet
