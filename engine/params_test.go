package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestSnapshotDiffListsEveryKeyWithBothValues(t *testing.T) {
	got := snapshotDiff(
		map[string]string{"a": "1", "b": "2", "gone": "x"},
		map[string]string{"a": "1", "b": "3", "new": "y"},
	)
	want := []string{`b: "2" at start, now "3"`, `gone: "x" at start, now absent`, `new: absent at start, now "y"`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q", got)
	}
}

// TestSnapshotDiffComparesSchemaVersionsByMajor: a run started under codec
// 1.0 resumes under 1.1; a major change is still a difference.
func TestSnapshotDiffComparesSchemaVersionsByMajor(t *testing.T) {
	for _, c := range []struct {
		stored, now string
		differ      bool
	}{{"1.0", "1.1", false}, {"1.1", "1.1", false}, {"1.1", "2.0", true}, {"1", "1.1", true}} {
		got := snapshotDiff(map[string]string{"store.schema_version": c.stored}, map[string]string{"store.schema_version": c.now})
		if (len(got) > 0) != c.differ {
			t.Errorf("%s → %s: diff %q, want differ=%t", c.stored, c.now, got, c.differ)
		}
	}
	if got := snapshotDiff(map[string]string{"model.version": "1.0"}, map[string]string{"model.version": "1.1"}); len(got) != 1 {
		t.Errorf("a key that is not a schema version compares exactly: %q", got)
	}
}

// TestCancelGraceDefaultsWhenUnset: the snapshot records the grace in
// force — the default when none is given, the given one otherwise.
func TestCancelGraceDefaultsWhenUnset(t *testing.T) {
	for _, c := range []struct {
		set  time.Duration
		want string
	}{{0, DefaultCancelGrace.String()}, {5 * time.Second, "5s"}} {
		req := Request{RunID: "r", Budget: Budget{MaxSteps: 1, MaxActions: 1, MaxConsecutiveParseFailures: 1, MaxPromptChars: 1},
			Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe, CancelGrace: c.set}
		snap, err := req.ParameterSnapshot()
		if err != nil {
			t.Fatal(err)
		}
		if got := snap["cancel_grace"]; got != c.want {
			t.Errorf("CancelGrace %s: snapshot says %q, want %q", c.set, got, c.want)
		}
	}
}

// TestAnEmptyRegistryAddsNoToolSection: a registry restricted to no tools
// offers the model nothing, so the prompt carries no tool section.
func TestAnEmptyRegistryAddsNoToolSection(t *testing.T) {
	reg, err := seams.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Tools: reg, Context: Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "goal")}}}
	if got := promptPrefix(req); len(got) != 1 {
		t.Fatalf("the prompt prefix has %d messages, want the goal alone", len(got))
	}
}
