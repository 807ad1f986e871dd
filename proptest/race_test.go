//go:build race

package proptest_test

// raceDetector: the race detector slows every child process several times,
// so tests that start many sample fewer.
const raceDetector = true
