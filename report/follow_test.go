package report_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// tailing is a MemStore that is a seams.RunTailer, recording what each
// LoadAfter was asked and every Load a reader made itself.
type tailing struct {
	*seamstest.MemStore
	asked []int // seen, per LoadAfter
	lasts []ulid.ULID
	loads int
}

func (s *tailing) LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error) {
	s.asked, s.lasts = append(s.asked, seen), append(s.lasts, last)
	stream, err := s.MemStore.Load(ctx, runID)
	return seams.StreamAfter(runID, stream, err, seen, last)
}

func (s *tailing) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	s.loads++
	return s.MemStore.Load(ctx, runID)
}

// TestAFollowerReadsWhatIsNew: a follower returns each event once, in
// order, as appends make it durable — the run's RunFinished last — asking
// a RunTailer only for what follows the events it returned (the count and
// the last key), never loading the stream itself; of a store that is not
// one, it loads the stream. Before the run starts, the store does not hold
// it: an error, ErrNoRun.
func TestAFollowerReadsWhatIsNew(t *testing.T) {
	ctx := context.Background()
	stream := proptest.SoundStream("f")
	for _, tails := range []bool{true, false} {
		mem := &seamstest.MemStore{}
		store := &tailing{MemStore: mem}
		var reader seams.RunReader = store
		if !tails {
			reader = mem
		}
		f := report.NewFollower(reader, "f")
		if got, err := f.Next(ctx); !errors.Is(err, seams.ErrNoRun) || len(got) != 0 || !strings.Contains(err.Error(), `no run "f" in the store`) {
			t.Fatalf("before the run started: %d events, %v; want an error saying the store holds no such run", len(got), err)
		}
		var got []events.Envelope
		var tail ulid.ULID
		for i := 0; i < len(stream); i += 4 {
			envs, err := mem.Append(ctx, "f", tail, stream[i:min(i+4, len(stream))]...)
			if err != nil {
				t.Fatal(err)
			}
			tail = envs[len(envs)-1].ID
			batch, err := f.Next(ctx)
			if err != nil || !reflect.DeepEqual(batch, envs) {
				t.Fatalf("after appending %d events: %d new, %v; want the %d appended", i+len(envs), len(batch), err, len(envs))
			}
			got = append(got, batch...)
		}
		if !f.Finished() || f.Seen() != len(stream) {
			t.Fatalf("after RunFinished: finished %t, %d seen", f.Finished(), f.Seen())
		}
		if batch, err := f.Next(ctx); err != nil || len(batch) != 0 {
			t.Fatalf("after RunFinished: %d events, %v", len(batch), err)
		}
		if !tails {
			continue
		}
		if store.loads != 0 {
			t.Errorf("the follower loaded the whole stream %d times itself", store.loads)
		}
		want := []int{0, 0, 4, 8, 12} // before the start, then after each batch
		if !reflect.DeepEqual(store.asked, want) {
			t.Errorf("LoadAfter asked after %v events, want %v", store.asked, want)
		}
		for i, seen := range store.asked {
			if seen > 0 && store.lasts[i] != got[seen-1].ID {
				t.Errorf("LoadAfter after %d events named %s, not the last of them", seen, store.lasts[i])
			}
		}
	}
}

// TestAFollowerSeesDamageAndAReplacedRun: a stream damaged while it is
// followed is reported as damage, and a run deleted and started again as
// seams.ErrStreamChanged — never as events that continue what was shown.
func TestAFollowerSeesDamageAndAReplacedRun(t *testing.T) {
	ctx := context.Background()
	stream := proptest.SoundStream("f")
	for _, c := range []struct {
		name   string
		change func(t *testing.T, s *seamstest.MemStore)
		want   error
	}{
		{"a new value damaged", func(t *testing.T, s *seamstest.MemStore) {
			loaded, _ := s.Load(ctx, "f")
			if _, err := s.Append(ctx, "f", loaded[len(loaded)-1].ID, stream[5:8]...); err != nil {
				t.Fatal(err)
			}
			s.Damage("f", 6, func(v []byte) []byte { v[len(v)/2] ^= 1; return v })
		}, events.ErrCorruption},
		{"the run deleted and started again", func(t *testing.T, s *seamstest.MemStore) {
			if err := s.DeleteRun(ctx, "f", true); err != nil {
				t.Fatal(err)
			}
			proptest.AppendEach(t, s, "f", stream)
		}, seams.ErrStreamChanged},
		{"the run deleted", func(t *testing.T, s *seamstest.MemStore) {
			if err := s.DeleteRun(ctx, "f", true); err != nil {
				t.Fatal(err)
			}
		}, seams.ErrStreamChanged},
	} {
		for _, tails := range []bool{true, false} {
			mem := &seamstest.MemStore{}
			var reader seams.RunReader = mem
			if tails {
				reader = &tailing{MemStore: mem}
			}
			proptest.AppendEach(t, mem, "f", stream[:5])
			f := report.NewFollower(reader, "f")
			if got, err := f.Next(ctx); err != nil || len(got) != 5 {
				t.Fatalf("%s: %d events, %v", c.name, len(got), err)
			}
			c.change(t, mem)
			if got, err := f.Next(ctx); !errors.Is(err, c.want) || len(got) != 0 {
				t.Errorf("%s (RunTailer %t): %d events, %v; want %v", c.name, tails, len(got), err, c.want)
			}
		}
	}
}

// endless is a store whose stream goes on after RunFinished, as only
// damage no check caught could make one.
type endless struct{ *seamstest.MemStore }

func (s endless) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	stream, err := s.MemStore.Load(ctx, runID)
	return append(stream, stream[1:3]...), err
}

// TestFollowStopsAtRunFinished: Follow hands batches over as they come
// and returns after the one holding RunFinished, handing over nothing
// after it; when ctx ends first, it returns ctx's error.
func TestFollowStopsAtRunFinished(t *testing.T) {
	stream := proptest.SoundStream("f")
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "f", stream)
	var got []events.Envelope
	bounded, cancelBounded := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelBounded()
	err := report.NewFollower(endless{mem}, "f").Follow(bounded, time.Millisecond, func(batch []events.Envelope) error {
		got = append(got, batch...)
		return nil
	}, nil)
	if err != nil || len(got) != len(stream) || got[len(got)-1].Kind != events.KindRunFinished {
		t.Fatalf("Follow: %d events handed over, %v; want the %d up to RunFinished", len(got), err, len(stream))
	}

	live := &seamstest.MemStore{}
	proptest.AppendEach(t, live, "f", stream[:3])
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	batches := 0
	err = report.NewFollower(live, "f").Follow(ctx, time.Millisecond, func([]events.Envelope) error { batches++; return nil }, nil)
	if !errors.Is(err, context.DeadlineExceeded) || batches != 1 {
		t.Fatalf("a run that does not finish: %d batches, %v; want 1 and ctx's error", batches, err)
	}
	stop := errors.New("enough")
	if err := report.NewFollower(live, "f").Follow(context.Background(), time.Millisecond, func([]events.Envelope) error { return stop }, nil); err != stop {
		t.Fatalf("fn's error: %v", err)
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{{"short", 10, "short"}, {"exactly", 7, "exactly"}, {"too long", 5, "too …"}, {"ünïcödé", 4, "ünï…"}} {
		if got := report.Clip(c.in, c.n); got != c.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// TestFollowingARunTheStoreDoesNotHoldFails: Follow of a run id the store
// has no run of ends at once with ErrNoRun, never waiting for it.
func TestFollowingARunTheStoreDoesNotHoldFails(t *testing.T) {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "other", proptest.SoundStream("other"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, store := range map[string]seams.RunReader{"RunTailer": &tailing{MemStore: mem}, "RunReader": mem} {
		err := report.NewFollower(store, "ghost").Follow(ctx, time.Millisecond, func([]events.Envelope) error {
			t.Errorf("%s: events of a run the store does not hold", name)
			return nil
		}, func(seams.RunInfo) error { t.Errorf("%s: liveness of a run the store does not hold", name); return nil })
		if !errors.Is(err, seams.ErrNoRun) {
			t.Errorf("%s: %v, want ErrNoRun", name, err)
		}
	}
}

// said records what a follower handed over: each batch's size and each
// liveness change, in order.
type said struct {
	mu   sync.Mutex
	what []string
}

func (s *said) events(batch []events.Envelope) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.what = append(s.what, fmt.Sprintf("%d events", len(batch)))
	return nil
}

func (s *said) live(info seams.RunInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.what = append(s.what, fmt.Sprintf("%s (owner %q)", info.Status, info.Owner))
	return nil
}

func (s *said) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.what, ", ")
}

// until waits for s to say want (or what match, when not nil, matches
// with want), failing t after a while.
func (s *said) until(t *testing.T, want string, match func(got, want string) bool) {
	t.Helper()
	if match == nil {
		match = func(got, want string) bool { return got == want }
	}
	for deadline := time.Now().Add(10 * time.Second); !match(s.String(), want); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower said %q, want %q", s.String(), want)
		}
	}
}

// TestAFollowerSaysWhenNobodyDrivesTheRun: following a run nobody holds,
// Follow says so once, after its events — not again while nothing
// changes, polls and liveness checks going on — and says again when a
// driver takes the run and appends, then follows it to its end. Of a
// store that is no RunDescriber, it reads the same from Runs.
func TestAFollowerSaysWhenNobodyDrivesTheRun(t *testing.T) {
	stream := proptest.SoundStream("r")
	for _, describes := range []bool{true, false} {
		mem := &seamstest.MemStore{}
		proptest.AppendEach(t, mem, "r", stream[:5])
		var store seams.RunReader = mem
		if !describes {
			store = readerOnly{mem}
		}
		var s said
		done := make(chan error, 1)
		go func() {
			done <- report.NewFollower(store, "r").Follow(context.Background(), time.Millisecond, s.events, s.live)
		}()
		s.until(t, `5 events, interrupted (owner "")`, nil)
		time.Sleep(1200 * time.Millisecond) // past a liveness check while nothing came: nothing new to say
		if got := s.String(); got != `5 events, interrupted (owner "")` {
			t.Fatalf("RunDescriber %t: while nothing changed the follower said %q", describes, got)
		}
		release, err := mem.LockRun("r") // a driver takes the run
		if err != nil {
			t.Fatal(err)
		}
		loaded, _ := mem.Load(context.Background(), "r")
		envs, err := mem.Append(context.Background(), "r", loaded[len(loaded)-1].ID, stream[5:8]...)
		if err != nil {
			t.Fatal(err)
		}
		// The driver goes on at once: the follower names it as the events
		// come, not only when nothing comes for a while.
		s.until(t, `5 events, interrupted (owner ""), 3 events`, strings.HasPrefix)
		if _, err := mem.Append(context.Background(), "r", envs[len(envs)-1].ID, stream[8:]...); err != nil {
			t.Fatal(err)
		}
		release()
		if err := <-done; err != nil {
			t.Fatalf("RunDescriber %t: %v", describes, err)
		}
		if want := fmt.Sprintf(`5 events, interrupted (owner ""), 3 events, running (owner "memstore"), %d events`, len(stream)-8); s.String() != want {
			t.Fatalf("RunDescriber %t: the follower said %q, want %q", describes, s.String(), want)
		}
	}
}

// TestAFollowerOfADrivenRunSaysNothingOfIt: a run a driver holds is
// followed without a word on liveness; one whose reader shows it
// interrupted already (Shown) is not said to be so again.
func TestAFollowerOfADrivenRunSaysNothingOfIt(t *testing.T) {
	stream := proptest.SoundStream("r")
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", stream[:5])
	release, err := mem.LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	var s said
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if err := report.NewFollower(mem, "r").Follow(ctx, time.Millisecond, s.events, s.live); !errors.Is(err, context.DeadlineExceeded) || s.String() != "5 events" {
		t.Fatalf("a driven run: the follower said %q, ended with %v", s.String(), err)
	}
	release()
	s = said{}
	f := report.NewFollower(mem, "r")
	f.Shown(seams.StatusInterrupted)
	ctx, cancel = context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if err := f.Follow(ctx, time.Millisecond, s.events, s.live); !errors.Is(err, context.DeadlineExceeded) || s.String() != "5 events" {
		t.Fatalf("a run shown interrupted: the follower said %q, ended with %v", s.String(), err)
	}
}

// loadsOnce serves one Load, then fails.
type loadsOnce struct {
	seams.RunReader
	loads int
}

func (s *loadsOnce) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	if s.loads++; s.loads > 1 {
		return nil, errors.New("the store went away")
	}
	return s.RunReader.Load(ctx, runID)
}

// TestFollowAfterNextSaysWhoDrivesTheRunFirst: Follow of a follower whose
// Next returned events already (the viewer's follow endpoint: the first
// Next tells whether the run exists) says who drives the run before it
// reads again.
func TestFollowAfterNextSaysWhoDrivesTheRunFirst(t *testing.T) {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:5])
	f := report.NewFollower(&loadsOnce{RunReader: mem}, "r")
	if batch, err := f.Next(context.Background()); len(batch) != 5 || err != nil {
		t.Fatalf("Next: %d events, %v", len(batch), err)
	}
	var s said
	err := f.Follow(context.Background(), time.Millisecond, s.events, s.live)
	if err == nil || s.String() != `interrupted (owner "")` {
		t.Fatalf("the follower said %q and ended with %v; want the liveness, then the store's error", s.String(), err)
	}
}

// damagedEntry is a store whose Describe finds the run's entry damaged.
type damagedEntry struct{ *seamstest.MemStore }

func (s damagedEntry) Describe(ctx context.Context, runID string) (seams.RunInfo, error) {
	return seams.RunInfo{}, &events.DamageError{RunID: runID, Problems: []error{errors.New("its index entry fails its checksum")}}
}

// TestLivenessLeavesDamageToNext: a run whose entry is damaged has no
// liveness to report, and no error from Liveness: Next reports the damage
// where the stream shows it.
func TestLivenessLeavesDamageToNext(t *testing.T) {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:5])
	f := report.NewFollower(damagedEntry{mem}, "r")
	if info, changed, err := f.Liveness(context.Background()); changed || err != nil {
		t.Fatalf("a damaged entry: %+v, changed %t, %v", info, changed, err)
	}
}
