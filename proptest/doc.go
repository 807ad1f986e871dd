// Package proptest holds PolyLoop's reusable test harnesses: sample streams
// that hold every record shape, and the contract suite any seams.RunStore
// implementation runs against itself (see RunStoreContract). It is imported
// only by tests; nothing in it runs in production code paths.
package proptest
