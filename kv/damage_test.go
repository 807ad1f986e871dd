package kv_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
)

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(entries)
}

// mapped reports whether this process maps path.
func mapped(t testing.TB, path string) bool {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	return strings.Contains(string(maps), path)
}

// TestARefusedOpenReleasesTheFile: every damaged copy that Open refuses is
// refused again — read-only and read-write, in either order — with the same
// kind of error, never ErrLocked; and afterwards the process holds no more
// descriptors than before and no mapping of the file.
func TestARefusedOpenReleasesTheFile(t *testing.T) {
	dir, _, whole := sampleStoreFile(t)
	// Every 7th of each kind; every 40th without POLYLOOP_SOAK=1.
	corpus, err := kvtest.DamageSample(whole, soak.Count(40, 7))
	if err != nil {
		t.Fatal(err)
	}
	refused, locked := 0, 0
	for i, d := range corpus {
		path := filepath.Join(dir, fmt.Sprintf("d%04d.db", i))
		if err := os.WriteFile(path, d.Bytes, 0o600); err != nil {
			t.Fatal(err)
		}
		fds := openFDs(t)
		var first error
		for _, ro := range []bool{true, false, true, false} {
			s, err := kv.Open(path, kv.Options{ReadOnly: ro, LockTimeout: 50e6})
			if err == nil {
				s.Close()
				continue
			}
			if errors.Is(err, kv.ErrLocked) {
				locked++
				t.Errorf("%s: read-only %t: %v", d.Name, ro, err)
				continue
			}
			if first == nil {
				first = err
				refused++
			} else if errors.Is(first, kv.ErrCorrupt) != errors.Is(err, kv.ErrCorrupt) {
				t.Errorf("%s: refused first with %v, then with %v", d.Name, first, err)
			}
		}
		if got := openFDs(t); got != fds {
			t.Errorf("%s: %d descriptors open before, %d after", d.Name, fds, got)
		}
		if mapped(t, path) {
			t.Errorf("%s: the file is still mapped", d.Name)
		}
		os.Remove(path)
	}
	t.Logf("%d damaged copies: %d refused, %d opens found the file locked", len(corpus), refused, locked)
}

// TestADamagedFileIsCorruption: a damaged file that Open refuses as
// ErrCorrupt is refused as corruption (events.ErrCorruption), the marker
// every layer's damage matches; one that is not a store is not damage.
func TestADamagedFileIsCorruption(t *testing.T) {
	dir, _, whole := sampleStoreFile(t)
	// The first copy of each kind: each meta field's, and the file
	// truncated at page 0, are the ones opened.
	corpus, err := kvtest.DamageSample(whole, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for i := range corpus {
		if !strings.HasPrefix(corpus[i].Name, "meta page") && !strings.HasPrefix(corpus[i].Name, "truncated at page 0") {
			continue
		}
		path := filepath.Join(dir, fmt.Sprintf("c%04d.db", i))
		if err := os.WriteFile(path, corpus[i].Bytes, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := kv.Open(path, kv.Options{ReadOnly: true})
		switch {
		case err == nil:
			s.Close()
		case errors.Is(err, kv.ErrCorrupt):
			counts["corrupt"]++
			if !errors.Is(err, events.ErrCorruption) {
				t.Errorf("%s: %v matches kv.ErrCorrupt, not events.ErrCorruption", corpus[i].Name, err)
			}
		case errors.Is(err, kv.ErrNotAStore):
			counts["not a store"]++
			if errors.Is(err, events.ErrCorruption) {
				t.Errorf("%s: %v is not a store and matches events.ErrCorruption", corpus[i].Name, err)
			}
		}
		os.Remove(path)
	}
	if counts["corrupt"] == 0 || counts["not a store"] == 0 {
		t.Fatalf("no damaged copy was refused as corrupt, or none as not a store (%v)", counts)
	}
	t.Logf("refused: %v", counts)
}
