//go:build race

package kv

// raceOn: the race detector is on, and allocates beside the code it watches.
const raceOn = true
