package engine

import (
	"strings"
	"testing"
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
