package soak_test

import (
	"testing"

	"github.com/polyloop/polyloop/internal/soak"
)

func TestCountFollowsTheEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{
		{"", 10},
		{"0", 10},
		{"yes", 10}, // only 1 selects the full counts
		{"1", 1000},
	} {
		t.Setenv(soak.Env, tc.env)
		if got := soak.Count(10, 1000); got != tc.want {
			t.Errorf("%s=%q: Count(10, 1000) = %d, want %d", soak.Env, tc.env, got, tc.want)
		}
		if soak.On() != (tc.want == 1000) {
			t.Errorf("%s=%q: On() = %t", soak.Env, tc.env, soak.On())
		}
	}
}
