//go:build !race

package proptest_test

const raceDetector = false
