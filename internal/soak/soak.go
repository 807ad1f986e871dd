// Package soak says how hard the long tests press: the counts of the
// README's test command (make ci), which exercise every guarantee in a few
// minutes on two cores, or — with POLYLOOP_SOAK=1, as make soak and CI set
// it — the full counts: a thousand generated runs per property, every race
// two hundred times, the SIGKILL loops and the damage corpus at full size.
//
// A test asks Count for its number (or On for a choice) and logs it, so a
// reader of its output knows which it ran. The short counts keep every case
// kind the full counts have (every store, every crash point kind, a sample
// of each damage kind); they differ only in how many are drawn.
//
// What does not live here: the tests, and any count a test must hold to
// prove its guarantee (those stay fixed whatever the mode).
package soak

import "os"

// Env is the environment variable that selects the full counts when set
// to 1.
const Env = "POLYLOOP_SOAK"

// On reports whether the full counts were asked for (POLYLOOP_SOAK=1).
func On() bool { return os.Getenv(Env) == "1" }

// Count returns full under POLYLOOP_SOAK=1 and quick otherwise.
func Count(quick, full int) int {
	if On() {
		return full
	}
	return quick
}
