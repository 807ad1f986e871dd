// Package kvtest is test support for kv, like net/http/httptest:
// DamageCorpus, damaged copies of a store file, for the damage tests (kv's
// own, and proptest's TestDamageCorpus, which opens every copy in a child
// process); UnopenableStores, a store path of each kind a command cannot
// open, for the tests of what the commands then say; and BoltFloor, the
// raw bbolt write that kv's and the engine's benchmarks measure against. It damages files by the bbolt format kv's
// file check reads them by (kv/internal/boltpage), so the two cannot
// drift apart. No command or example links it (the root's deps_test.go
// checks).
//
// What does not live here: the store (package kv), the format itself
// (kv/internal/boltpage) and the harnesses every store shares (proptest).
package kvtest
