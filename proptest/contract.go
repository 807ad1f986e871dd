package proptest

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
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/seams"
)

// RunStoreContract checks that a seams.RunStore keeps the contract the
// engine and recovery rely on. open must return a new, empty store; the suite
// runs its subtests sequentially against stores it opens.
func RunStoreContract(t *testing.T, open func(t *testing.T) seams.RunStore) {
	ctx := context.Background()

	t.Run("UnknownRunLoadsEmptyWithoutError", func(t *testing.T) {
		s := open(t)
		if got := mustLoad(t, s, "never-written"); len(got) != 0 {
			t.Fatalf("unknown run has %d events", len(got))
		}
	})

	t.Run("EveryRecordRoundTripsInOrder", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("rt")
		var appended []events.Envelope
		for i := 0; i < len(stream); {
			n := 1 + i%3 // mix one-event and multi-event appends
			if i+n > len(stream) {
				n = len(stream) - i
			}
			appended = append(appended, mustAppend(t, s, "rt", stream[i:i+n]...)...)
			i += n
		}
		got := mustLoad(t, s, "rt")
		if len(got) != len(stream) {
			t.Fatalf("loaded %d events, appended %d", len(got), len(stream))
		}
		for i, env := range got {
			if !reflect.DeepEqual(env.Event, stream[i]) {
				t.Errorf("event %d: got %#v, want %#v", i, env.Event, stream[i])
			}
			if env.ID != appended[i].ID || env.Kind != stream[i].Kind() || env.SchemaVersion == "" {
				t.Errorf("event %d: envelope %v/%s differs from the one Append returned (%v)", i, env.ID, env.Kind, appended[i].ID)
			}
			if i > 0 && env.ID.Compare(got[i-1].ID) <= 0 {
				t.Errorf("event %d: ids not increasing", i)
			}
		}
		failed := append([]events.Event{SoundStream("mf")[0]}, FailedModelCall("mf", 0)...)
		mustAppend(t, s, "mf", failed...)
		got = mustLoad(t, s, "mf")
		for i := range failed {
			if !reflect.DeepEqual(got[i].Event, failed[i]) {
				t.Errorf("failed-call event %d: got %#v, want %#v", i, got[i].Event, failed[i])
			}
		}
	})

	t.Run("FirstEventMustBeRunStarted", func(t *testing.T) {
		s := open(t)
		_, err := s.Append(ctx, "r", tail(t, s, "r"), SoundStream("r")[1])
		if !errors.Is(err, seams.ErrRunNotStarted) {
			t.Fatalf("got %v, want ErrRunNotStarted", err)
		}
		if got := mustLoad(t, s, "r"); len(got) != 0 {
			t.Fatalf("refused append left %d events", len(got))
		}
	})

	t.Run("OneAppendIsAtomic", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("a")
		mustAppend(t, s, "a", stream[:2]...)
		bad := []events.Event{
			stream[2], stream[3],
			events.Intent{RunID: "someone-else", IntentKind: events.IntentAction, ResultID: "x", ReplayPolicy: events.ReplayNever},
		}
		if _, err := s.Append(ctx, "a", tail(t, s, "a"), bad...); err == nil {
			t.Fatal("append with an event of another run succeeded")
		}
		if _, err := s.Append(ctx, "a", tail(t, s, "a"), stream[2], stream[0]); !errors.Is(err, seams.ErrRunExists) {
			t.Fatalf("second RunStarted mid-batch: got %v, want ErrRunExists", err)
		}
		if got := mustLoad(t, s, "a"); len(got) != 2 {
			t.Fatalf("refused appends changed the stream: %d events, want 2", len(got))
		}
	})

	t.Run("RunStartedOnNonEmptyStreamFails", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("x")
		mustAppend(t, s, "x", stream[0])
		if _, err := s.Append(ctx, "x", tail(t, s, "x"), stream[0]); !errors.Is(err, seams.ErrRunExists) {
			t.Fatalf("got %v, want ErrRunExists", err)
		}
		if _, err := s.Append(ctx, "x", ulid.ULID{}, stream[0]); !errors.Is(err, seams.ErrRunExists) {
			t.Fatalf("a start naming an empty stream: got %v, want ErrRunExists", err)
		}
	})

	t.Run("ExactlyOneOfConcurrentStartsWins", func(t *testing.T) {
		s := open(t)
		exactlyOneWins(t, "concurrent starts", seams.ErrRunExists, func(i int) error {
			start := events.RunStarted{RunID: "race", SchemaVersion: events.CurrentSchemaVersion,
				ParameterSnapshot: map[string]string{"who": fmt.Sprint(i)}}
			_, err := s.Append(ctx, "race", ulid.ULID{}, start)
			return err
		})
		if got := mustLoad(t, s, "race"); len(got) != 1 {
			t.Fatalf("stream has %d events after the race, want 1", len(got))
		}
	})

	// Writers may append records as values or as pointers to them; the
	// rules hold alike.
	for _, form := range []struct {
		name string
		of   func([]events.Event) []events.Event
	}{{"Values", func(evs []events.Event) []events.Event { return evs }}, {"Pointers", pointed}} {
		t.Run("NothingFollowsRunFinished/"+form.name, func(t *testing.T) {
			s := open(t)
			stream := form.of(SoundStream("f"))
			mustAppend(t, s, "f", stream...)
			extra := events.Intent{RunID: "f", IntentKind: events.IntentModelCall, CallIndex: 4, ResultID: "late", ReplayPolicy: events.ReplaySafe}
			if _, err := s.Append(ctx, "f", tail(t, s, "f"), extra); !errors.Is(err, seams.ErrRunFinished) {
				t.Fatalf("got %v, want ErrRunFinished", err)
			}
			if _, err := s.Append(ctx, "f", tail(t, s, "f"), stream[len(stream)-1]); !errors.Is(err, seams.ErrRunFinished) {
				t.Fatalf("second RunFinished: got %v, want ErrRunFinished", err)
			}
			if got := mustLoad(t, s, "f"); len(got) != len(stream) {
				t.Fatalf("stream has %d events, want %d", len(got), len(stream))
			}
			if lister, ok := s.(seams.RunReader); ok {
				runs, err := lister.Runs(ctx)
				if err != nil || len(runs) != 1 || runs[0].Status != seams.StatusFinished || runs[0].Steps == 0 {
					t.Fatalf("Runs: %+v (%v), want the run finished with its steps counted", runs, err)
				}
			}
		})
	}

	// A listing is the streams' summary: a store's index entry for a run
	// is what folding its stream says (projections.Summarize), with the
	// liveness of a run nobody holds, so a
	// reader may decide from either and a store may check one against
	// the other.
	t.Run("TheIndexSummarisesEachStream", func(t *testing.T) {
		s := open(t)
		lister, ok := s.(seams.RunReader)
		if !ok {
			t.Skip("the store does not implement seams.RunReader")
		}
		whole, part := SoundStream("whole"), SoundStream("part")
		mustAppend(t, s, "whole", whole[:4]...)
		mustAppend(t, s, "whole", whole[4:]...)
		mustAppend(t, s, "part", part[:6]...)
		mustAppend(t, s, "part", part[6])
		runs, err := lister.Runs(ctx)
		if err != nil || len(runs) != 2 {
			t.Fatalf("Runs: %+v (%v), want two runs", runs, err)
		}
		for _, got := range runs {
			want := projections.Summarize(mustLoad(t, s, got.RunID))
			// Nobody holds either run and neither was started for an
			// agent: the unfinished one is listed interrupted.
			want.Liveness(time.Now())
			if got.RunID != want.RunID || got.Status != want.Status || got.Steps != want.Steps || got.Events != want.Events ||
				got.StopReason != want.StopReason || got.LastID != want.LastID ||
				!got.FirstEvent.Equal(want.FirstEvent) || !got.LastEvent.Equal(want.LastEvent) {
				t.Errorf("run %q: listed %+v, its stream sums up to %+v", got.RunID, got, want)
			}
		}
	})

	t.Run("TheEnvelopesAppendReturnsAreTheCallers", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("own")
		envs := mustAppend(t, s, "own", stream[:2]...)
		tailID := envs[1].ID
		for i := range envs {
			envs[i] = events.Envelope{} // the caller may reuse the slice
		}
		if _, err := s.Append(ctx, "own", tailID, stream[2:]...); err != nil {
			t.Fatalf("continuing after the tail Append returned: %v", err)
		}
		if got := mustLoad(t, s, "own"); len(got) != len(stream) || got[1].ID != tailID || got[0].Kind != events.KindRunStarted {
			t.Fatalf("after the caller overwrote its envelopes, Load returns %d events, want %d as appended", len(got), len(stream))
		}
	})

	t.Run("ConcurrentRunsKeepTheirOwnOrder", func(t *testing.T) {
		s := open(t)
		const runs = 16
		var wg sync.WaitGroup
		for r := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("c%02d", r)
				var last ulid.ULID
				for _, ev := range SoundStream(id) {
					envs, err := s.Append(ctx, id, last, ev)
					if err != nil {
						t.Errorf("run %s: %v", id, err)
						return
					}
					last = envs[0].ID
				}
			}()
		}
		wg.Wait()
		for r := range runs {
			id := fmt.Sprintf("c%02d", r)
			got := mustLoad(t, s, id)
			want := SoundStream(id)
			if len(got) != len(want) {
				t.Fatalf("run %s: %d events, want %d", id, len(got), len(want))
			}
			for i := range want {
				if !reflect.DeepEqual(got[i].Event, want[i]) {
					t.Fatalf("run %s event %d out of order or changed", id, i)
				}
			}
		}
	})

	t.Run("InvalidEventsAreRefusedWithAReason", func(t *testing.T) {
		s := open(t)
		cases := map[string][]events.Event{
			"no events":    nil,
			"nil event":    {nil},
			"empty run id": {events.RunStarted{SchemaVersion: events.CurrentSchemaVersion}},
		}
		for name, evs := range cases {
			if _, err := s.Append(ctx, "v", tail(t, s, "v"), evs...); err == nil || err.Error() == "" {
				t.Errorf("%s: got %v, want an error", name, err)
			}
		}
		if got := mustLoad(t, s, "v"); len(got) != 0 {
			t.Fatalf("refused appends wrote %d events", len(got))
		}
	})

	t.Run("WhatAppendAcceptsLoadReturns", func(t *testing.T) {
		// A reply at the limit (compressible, as the one once written and
		// then refused as damage was) round-trips; one over it is refused
		// with events.ErrTooLarge, together with the rest of its append,
		// and the stream goes on from where it was.
		s := open(t)
		stream := SoundStream("big")
		mustAppend(t, s, "big", stream[:2]...) // RunStarted, the model intent
		// One text, the reply at the limit its prefix (under the race
		// detector each 64 MiB made costs a second).
		text := strings.Repeat("all work and no play ", (events.MaxPayload+64)/21+1)
		reply := func(n int) events.ModelCallResult {
			r := stream[2].(events.ModelCallResult)
			r.Reply = &events.ModelReply{Content: text[:n]}
			return r
		}
		_, err := s.Append(ctx, "big", tail(t, s, "big"), reply(events.MaxPayload+64), stream[3])
		if !errors.Is(err, events.ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(events.MaxPayload)) {
			t.Fatalf("appending a reply over the limit: %v, want events.ErrTooLarge naming %d", err, events.MaxPayload)
		}
		if got := mustLoad(t, s, "big"); len(got) != 2 {
			t.Fatalf("a refused append left %d events, want the 2 before it", len(got))
		}
		atLimit := reply(events.MaxPayload - 1024)
		mustAppend(t, s, "big", atLimit, stream[3])
		got := mustLoad(t, s, "big")
		if len(got) != 4 || !reflect.DeepEqual(got[2].Event, events.Event(atLimit)) {
			t.Fatalf("a reply at the limit did not round-trip (%d events loaded)", len(got))
		}
	})

	// One rule for run ids (seams.ValidRunID), the same in every store:
	// what one store keeps, every store keeps, and an id one could not
	// keep (PostgreSQL text holds no NUL) is refused by all of them as an
	// invalid request, never with a database's error.
	t.Run("EveryStoreKeepsTheSameRunIDs", func(t *testing.T) {
		s := open(t)
		for _, id := range []string{"ünïcödé 🙂", "a/b?c#d%&run=x", `quote"and\backslash`, "zero\u200bwidth",
			strings.Repeat("x", seams.MaxRunIDBytes), strings.Repeat("é", seams.MaxRunIDBytes/2)} {
			stream := SoundStream(id)
			mustAppend(t, s, id, stream...)
			if got := mustLoad(t, s, id); len(got) != len(stream) {
				t.Errorf("run %.40q: %d events loaded, %d appended", id, len(got), len(stream))
			}
		}
		var kept int
		if r, ok := s.(seams.RunReader); ok {
			runs, err := r.Runs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			kept = len(runs)
		}
		for _, id := range []string{"", "a\x00b", "\xff", "ok\xc3", "a\nb", "\x1b[31mred", "del\x7f", "c1\u0085",
			strings.Repeat("x", seams.MaxRunIDBytes+1)} {
			start := events.RunStarted{RunID: id, SchemaVersion: events.CurrentSchemaVersion}
			if _, err := s.Append(ctx, id, ulid.ULID{}, start); !errors.Is(err, seams.ErrInvalidRunID) {
				t.Errorf("Append to run %.40q: got %v, want ErrInvalidRunID", id, err)
			}
			if got, err := s.Load(ctx, id); !errors.Is(err, seams.ErrInvalidRunID) || len(got) != 0 {
				t.Errorf("Load of run %.40q: %d events, %v; want ErrInvalidRunID", id, len(got), err)
			}
			if sc, ok := s.(seams.RunScanner); ok {
				err := sc.Scan(ctx, id, func(events.Envelope) error { t.Error("fn called"); return nil })
				if !errors.Is(err, seams.ErrInvalidRunID) {
					t.Errorf("Scan of run %.40q: got %v, want ErrInvalidRunID", id, err)
				}
			}
		}
		if r, ok := s.(seams.RunReader); ok {
			if runs, err := r.Runs(ctx); err != nil || len(runs) != kept {
				t.Errorf("after the refused appends the store lists %d runs (%v), want %d", len(runs), err, kept)
			}
		}
	})

	t.Run("HasRunAgreesWithLoad", func(t *testing.T) {
		s := open(t)
		f, ok := s.(seams.RunFinder)
		if !ok {
			t.Skip("the store does not implement seams.RunFinder")
		}
		has := func(run string) bool {
			t.Helper()
			found, err := f.HasRun(ctx, run)
			if err != nil {
				t.Fatalf("HasRun(%q): %v", run, err)
			}
			return found
		}
		if has("h") {
			t.Fatal("HasRun of a run never written: true")
		}
		mustAppend(t, s, "h", SoundStream("h")[0])
		if !has("h") || has("h2") {
			t.Fatal("HasRun does not say which runs have a log")
		}
		if _, err := f.HasRun(ctx, "a\x00b"); !errors.Is(err, seams.ErrInvalidRunID) {
			t.Fatalf("HasRun of a run id no store keeps: %v, want seams.ErrInvalidRunID", err)
		}
	})

	t.Run("AnAppendNamingAnotherTailWritesNothing", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("t")
		first := mustAppend(t, s, "t", stream[0])
		mustAppend(t, s, "t", stream[1])
		before := mustLoad(t, s, "t")
		stale := map[string]ulid.ULID{
			"an earlier event":    first[0].ID,
			"an empty stream":     {},
			"an id never written": ulid.MustParse("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
		}
		for name, after := range stale {
			if _, err := s.Append(ctx, "t", after, stream[2]); !errors.Is(err, seams.ErrTailMoved) {
				t.Errorf("append after %s: got %v, want ErrTailMoved", name, err)
			}
		}
		if _, err := s.Append(ctx, "never-written", first[0].ID, SoundStream("never-written")[0]); !errors.Is(err, seams.ErrTailMoved) {
			t.Errorf("append to an empty stream naming a tail: got %v, want ErrTailMoved", err)
		}
		if got := mustLoad(t, s, "t"); !reflect.DeepEqual(got, before) {
			t.Fatalf("refused appends changed the stream: %d events, want %d", len(got), len(before))
		}
		// A finished run refuses a writer that saw it unfinished with
		// ErrTailMoved: that writer lost to the one that finished it.
		mustAppend(t, s, "t", stream[2:]...)
		if _, err := s.Append(ctx, "t", before[len(before)-1].ID, stream[2]); !errors.Is(err, seams.ErrTailMoved) {
			t.Errorf("stale append to a finished run: got %v, want ErrTailMoved", err)
		}
	})

	t.Run("ExactlyOneOfConcurrentContinuationsWins", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("c")
		at := mustAppend(t, s, "c", stream[:2]...)[1].ID
		exactlyOneWins(t, "appends continuing one tail", seams.ErrTailMoved, func(int) error {
			_, err := s.Append(ctx, "c", at, stream[2], stream[3])
			return err
		})
		if got := mustLoad(t, s, "c"); len(got) != 4 {
			t.Fatalf("stream has %d events after the race, want 4", len(got))
		}
	})

	t.Run("RunLocksReserveOneRunForOneDriver", func(t *testing.T) {
		s := open(t)
		l, ok := s.(seams.RunLocker)
		if !ok {
			t.Skip("the store does not implement seams.RunLocker")
		}
		release, err := l.LockRun("held")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.LockRun("held"); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("second LockRun: got %v, want ErrRunLocked", err)
		}
		other, err := l.LockRun("other")
		if err != nil {
			t.Fatalf("another run: %v", err)
		}
		other()
		release()
		release() // a second release is harmless
		again, err := l.LockRun("held")
		if err != nil {
			t.Fatalf("LockRun after release: %v", err)
		}
		again()
	})

	t.Run("ScanHandsOverWhatLoadReturns", func(t *testing.T) {
		s := open(t)
		sc, ok := s.(seams.RunScanner)
		if !ok {
			t.Skip("the store does not implement seams.RunScanner")
		}
		mustAppend(t, s, "s", SoundStream("s")[:5]...)
		mustAppend(t, s, "s", SoundStream("s")[5:]...)
		var got []events.Envelope
		if err := sc.Scan(ctx, "s", func(env events.Envelope) error { got = append(got, env); return nil }); err != nil {
			t.Fatal(err)
		}
		if want := mustLoad(t, s, "s"); !reflect.DeepEqual(got, want) {
			t.Fatalf("Scan handed over %d events, Load returns %d (or they differ)", len(got), len(want))
		}
		stop := errors.New("enough")
		calls := 0
		if err := sc.Scan(ctx, "s", func(events.Envelope) error { calls++; return stop }); err != stop || calls != 1 {
			t.Fatalf("fn's error: Scan returned %v after %d calls, want it as it is after 1", err, calls)
		}
		if err := sc.Scan(ctx, "never-written", func(events.Envelope) error { t.Fatal("fn called"); return nil }); err != nil {
			t.Fatalf("a run never written: %v", err)
		}
	})

	RunTailerContract(t, open)
}

// mustLoad is run's stream in s; any error fails the test.
func mustLoad(t *testing.T, s seams.RunStore, run string) []events.Envelope {
	t.Helper()
	got, err := s.Load(context.Background(), run)
	if err != nil {
		t.Fatalf("Load(%q): %v", run, err)
	}
	return got
}

// tail is the id of run's last event, or zero: what a writer that has
// just loaded the stream names as the tail it continues.
func tail(t *testing.T, s seams.RunStore, run string) ulid.ULID {
	t.Helper()
	got := mustLoad(t, s, run)
	if len(got) == 0 {
		return ulid.ULID{}
	}
	return got[len(got)-1].ID
}

// mustAppend appends evs to run after its current tail; any error fails
// the test.
func mustAppend(t *testing.T, s seams.RunStore, run string, evs ...events.Event) []events.Envelope {
	t.Helper()
	envs, err := s.Append(context.Background(), run, tail(t, s, run), evs...)
	if err != nil {
		t.Fatalf("Append(%q, %d events): %v", run, len(evs), err)
	}
	return envs
}

// RunTailerContract checks a seams.RunTailer's LoadAfter: from every
// event of a stream, exactly the events Load returns after it, in order —
// also when what follows refers to a reply before it (a long reply's step,
// which a store may write as a reference) — and ErrStreamChanged for a
// stream that no longer continues what the caller saw: shorter, another
// event where the caller's last one was, a run deleted and started again.
// RunStoreContract runs it for every store that is a RunTailer; open must
// return a new, empty store.
func RunTailerContract(t *testing.T, open func(t *testing.T) seams.RunStore) {
	ctx := context.Background()
	loadAfter := func(t *testing.T, s seams.RunStore, run string, seen int, last ulid.ULID) ([]events.Envelope, error) {
		t.Helper()
		tl, ok := s.(seams.RunTailer)
		if !ok {
			t.Skip("the store does not implement seams.RunTailer")
		}
		return tl.LoadAfter(ctx, run, seen, last)
	}
	everyPlace := func(t *testing.T, s seams.RunStore, run string) []events.Envelope {
		t.Helper()
		want, err := s.Load(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		for seen := 0; seen <= len(want); seen++ {
			var last ulid.ULID
			if seen > 0 {
				last = want[seen-1].ID
			}
			got, err := loadAfter(t, s, run, seen, last)
			if err != nil || !sameEvents(got, want[seen:]) {
				t.Errorf("LoadAfter the first %d events of %d: %d events (%v), want the %d Load returns after them",
					seen, len(want), len(got), err, len(want)-seen)
			}
		}
		return want
	}

	t.Run("FromEveryEventWhatLoadReturnsAfterIt", func(t *testing.T) {
		s := open(t)
		if got, err := loadAfter(t, s, "never-written", 0, ulid.ULID{}); err != nil || len(got) != 0 {
			t.Fatalf("a run never written: %d events, %v; want none", len(got), err)
		}
		stream := SoundStream("f")
		var tail ulid.ULID
		for i := 0; i < len(stream); { // one-, two- and three-event appends
			n := min(1+i%3, len(stream)-i)
			envs, err := s.Append(ctx, "f", tail, stream[i:i+n]...)
			if err != nil {
				t.Fatal(err)
			}
			tail, i = envs[len(envs)-1].ID, i+n
		}
		everyPlace(t, s, "f")
		long := LongReplyStream("long")
		AppendEach(t, s, "long", long) // as a driver writes: each event after the last
		if got := everyPlace(t, s, "long"); len(got) != len(long) || !reflect.DeepEqual(got[4].Event, long[4]) {
			t.Fatalf("the long reply's step did not round-trip")
		}
	})

	t.Run("AStreamThatNoLongerContinuesIsRefused", func(t *testing.T) {
		s := open(t)
		stream := SoundStream("c")
		AppendEach(t, s, "c", stream[:6])
		seen, err := s.Load(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		other := ulid.MustParse("01ARZ3NDEKTSV4RRFFQ69G5FAV")
		for name, c := range map[string]struct {
			run  string
			seen int
			last ulid.ULID
		}{
			"a run never written":                      {"never-written", 1, other},
			"more events seen than it holds":           {"c", 7, seen[5].ID},
			"another event where the last seen was":    {"c", 4, other},
			"an earlier event where the last seen was": {"c", 4, seen[2].ID},
		} {
			if got, err := loadAfter(t, s, c.run, c.seen, c.last); !errors.Is(err, seams.ErrStreamChanged) || len(got) != 0 {
				t.Errorf("%s: %d events, %v; want ErrStreamChanged", name, len(got), err)
			}
		}
		if _, err := loadAfter(t, s, "c", -1, ulid.ULID{}); err == nil || !strings.Contains(err.Error(), "-1") {
			t.Errorf("a negative count seen: %v, want an error naming it", err)
		}
		if _, err := loadAfter(t, s, "a\x00b", 0, ulid.ULID{}); !errors.Is(err, seams.ErrInvalidRunID) {
			t.Errorf("a run id no store keeps: %v, want ErrInvalidRunID", err)
		}
		d, ok := s.(seams.RunDeleter)
		if !ok {
			return
		}
		if err := d.DeleteRun(ctx, "c", true); err != nil {
			t.Fatal(err)
		}
		if got, err := loadAfter(t, s, "c", 6, seen[5].ID); !errors.Is(err, seams.ErrStreamChanged) {
			t.Errorf("a deleted run: %d events, %v; want ErrStreamChanged", len(got), err)
		}
		AppendEach(t, s, "c", stream) // started again, longer than before
		for _, n := range []int{1, 6} {
			if got, err := loadAfter(t, s, "c", n, seen[n-1].ID); !errors.Is(err, seams.ErrStreamChanged) {
				t.Errorf("a run started again, after %d events seen: %d events, %v; want ErrStreamChanged", n, len(got), err)
			}
		}
	})
}

// FollowPoll benchmarks one poll of a follower of a long run (800 events)
// on s, a new, empty store that is a seams.RunTailer: the whole stream
// (Load, what a follower read before LoadAfter), the four events of a
// step written since the last poll, and nothing new.
func FollowPoll(b *testing.B, s seams.RunStore) {
	ctx := context.Background()
	tl, ok := s.(seams.RunTailer)
	if !ok {
		b.Skip("the store does not implement seams.RunTailer")
	}
	sound := SoundStream("r")
	envs, err := s.Append(ctx, "r", ulid.ULID{}, sound[0])
	if err != nil {
		b.Fatal(err)
	}
	for range 200 {
		if envs, err = s.Append(ctx, "r", envs[len(envs)-1].ID, sound[1:5]...); err != nil {
			b.Fatal(err)
		}
	}
	stream, err := s.Load(ctx, "r")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		new  int
	}{{"Load", len(stream)}, {"LoadAfter/a step new", 4}, {"LoadAfter/nothing new", 0}} {
		b.Run(c.name, func(b *testing.B) {
			seen := len(stream) - c.new
			for b.Loop() {
				var got []events.Envelope
				if c.new == len(stream) {
					got, err = s.Load(ctx, "r")
				} else {
					got, err = tl.LoadAfter(ctx, "r", seen, stream[seen-1].ID)
				}
				if err != nil || len(got) != c.new {
					b.Fatalf("%d events, %v; want %d", len(got), err, c.new)
				}
			}
		})
	}
}

// LongReplyStream is SoundStream with a first reply long enough that a
// store may keep its step's raw output as a reference to it.
func LongReplyStream(runID string) []events.Event {
	stream := SoundStream(runID)
	var b strings.Builder
	b.WriteString("TOOL list ")
	for i := range 80 { // text that compresses like text, not like one phrase repeated
		fmt.Fprintf(&b, "file %d is f%x.go, ", i, i*7919%4093)
	}
	mr, sc := stream[2].(events.ModelCallResult), stream[4].(events.StepCompleted)
	reply := *mr.Reply
	reply.Content = b.String()
	mr.Reply = &reply
	sc.Step.RawOutput, sc.Step.ContentChars = reply.Content, len([]rune(reply.Content))
	stream[2], stream[4] = mr, sc
	return stream
}

// sameEvents reports whether a and b hold the same envelopes (an empty
// slice and nil alike).
func sameEvents(a, b []events.Envelope) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

// exactlyOneWins runs try 50 times at once and requires exactly one to
// succeed and every other to fail with lose.
func exactlyOneWins(t *testing.T, what string, lose error, try func(i int) error) {
	t.Helper()
	const n = 50
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = try(i)
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, lose):
			t.Errorf("%s: a loser got %v, want %v", what, err, lose)
		}
	}
	if wins != 1 {
		t.Fatalf("%d of %d %s won, want exactly 1", wins, n, what)
	}
}

// pointed is evs with each record held by a pointer, as a writer may
// append them.
func pointed(evs []events.Event) []events.Event {
	out := make([]events.Event, len(evs))
	for i, ev := range evs {
		p := reflect.New(reflect.TypeOf(ev))
		p.Elem().Set(reflect.ValueOf(ev))
		out[i] = p.Interface().(events.Event)
	}
	return out
}
