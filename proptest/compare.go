package proptest

import (
	"reflect"

	"github.com/polyloop/polyloop/events"
)

// SameSteps reports whether two trajectories are equal field by field,
// timing (step_wall_ms) aside: what "the resumed run equals the
// uninterrupted one" means.
func SameSteps(a, b []events.StepRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		x.StepWallMs, y.StepWallMs = 0, 0
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}
