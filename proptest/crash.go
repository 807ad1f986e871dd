package proptest

import "github.com/polyloop/polyloop/crashstore"

// CrashingStore is crashstore.Store under the name the tests use: a
// RunStore that crashes after a number of appends.
type CrashingStore = crashstore.Store

// ErrCrashed is crashstore.ErrCrashed.
var ErrCrashed = crashstore.ErrCrashed
