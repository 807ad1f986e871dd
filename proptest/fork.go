package proptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// ForkStore is a store that forks runs: what RunForkerContract checks.
type ForkStore interface {
	seams.RunStore
	seams.RunReader
	seams.RunLocker
	seams.RunForker
}

// StoredValues is the values s stores for run's events, in order, each as
// it is sealed (events.Seal), without whatever the store keeps beside it:
// how RunForkerContract reads the bytes a fork copied.
type StoredValues func(t *testing.T, s ForkStore, run string) [][]byte

// RunForkerContract checks that a store keeps the rules of
// seams.RunForker as engine.Fork relies on them, so that every store
// forks alike: the fork's stream is its RunStarted then the source's
// events up to through — kinds and events as the source's, values byte
// for byte but for the seal — under fresh, increasing keys, sound under
// recovery when the prefix ends a step; a zero through copies nothing;
// every refusal (ErrRunExists, seams.ErrNoRun, seams.ErrForkPrefix, a
// RunStarted or run id that is not the fork's) writes nothing; of
// concurrent forks onto one id exactly one wins; the source goes on alone;
// the fork is listed like any run (Runs, Describe and the queue where the
// store has them), goes on after its last key under the driver that
// reserved it (its later steps may refer to the prefix's latest reply, as
// a store's references do), and is forked again. open must return a new,
// empty store; values reads a store's values (StoredValues).
func RunForkerContract(t *testing.T, open func(t *testing.T) ForkStore, values StoredValues) {
	ctx := context.Background()

	t.Run("AForkIsItsStartThenTheSourcesPrefixUnderFreshKeys", func(t *testing.T) {
		s := open(t)
		src := forkSource("src")
		for i := 0; i < len(src); { // the source written in batches of one to three
			n := min(1+i%3, len(src)-i)
			mustAppend(t, s, "src", src[i:i+n]...)
			i += n
		}
		source := mustLoad(t, s, "src")
		srcValues := values(t, s, "src")
		keys := map[ulid.ULID]string{}
		for _, env := range source {
			keys[env.ID] = "src"
		}
		// A fork at every event of the source, and one with a zero through.
		for k := -1; k < len(source); k++ {
			run, through, n := fmt.Sprintf("fork-%02d", k), ulid.ULID{}, 0
			if k >= 0 {
				run, through, n = fmt.Sprintf("fork-%02d", k), source[k].ID, k
			}
			steps := stepsIn(source[:n+1])
			started := forkStart(run, "src", steps, through)
			got := mustFork(t, s, run, started, "src", through, n)
			stream := mustLoad(t, s, run)
			if !sameEvents(got, stream) {
				t.Fatalf("fork through event %d: ForkRun returned %d events, Load %d, or they differ", k, len(got), len(stream))
			}
			if len(stream) != 1+n {
				t.Fatalf("fork through event %d holds %d events, want its start and %d", k, len(stream), n)
			}
			if stream[0].Kind != events.KindRunStarted || !reflect.DeepEqual(stream[0].Event, started) {
				t.Errorf("fork through event %d starts with %#v, want %#v", k, stream[0].Event, started)
			}
			for i := 1; i < len(stream); i++ {
				if stream[i].Kind != source[i].Kind || !reflect.DeepEqual(stream[i].Event, source[i].Event) {
					t.Errorf("fork through event %d: event %d is %s %#v, the source's %s %#v", k, i, stream[i].Kind, stream[i].Event, source[i].Kind, source[i].Event)
				}
			}
			for i, env := range stream {
				if i > 0 && env.ID.Compare(stream[i-1].ID) <= 0 {
					t.Errorf("fork through event %d: key %d (%s) does not follow key %d (%s)", k, i, env.ID, i-1, stream[i-1].ID)
				}
				if other, taken := keys[env.ID]; taken {
					t.Errorf("fork through event %d: key %d (%s) is %s's too", k, i, env.ID, other)
				}
				keys[env.ID] = run
			}
			sameValues(t, values(t, s, run), srcValues, n)
			if through == (ulid.ULID{}) || source[k].Kind == events.KindStepCompleted || k == 0 {
				// The prefix ends a step (or holds none): the fork is a
				// sound log, its steps the source's first ones.
				sound(t, run, stream, steps)
			}
		}
		if got := mustLoad(t, s, "src"); !sameEvents(got, source) {
			t.Fatal("forking changed the source's stream")
		}
	})

	t.Run("EveryRefusalWritesNothing", func(t *testing.T) {
		s := open(t)
		src := SoundStream("src")
		mustAppend(t, s, "src", src...)
		mustAppend(t, s, "other", SoundStream("other")[:3]...)
		source := mustLoad(t, s, "src")
		at := 7 // the end of step 1
		foreign := mustLoad(t, s, "other")[1].ID
		for _, c := range []struct {
			name, run, source string
			started           events.RunStarted
			through           ulid.ULID
			n                 int
			want              error // nil: any error
		}{
			{"onto a run that exists", "other", "src", forkStart("other", "src", 2, source[at].ID), source[at].ID, at, seams.ErrRunExists},
			{"onto the source itself", "src", "src", forkStart("src", "src", 2, source[at].ID), source[at].ID, at, nil},
			{"from a run never written", "f", "nowhere", forkStart("f", "nowhere", 2, source[at].ID), source[at].ID, at, seams.ErrNoRun},
			{"through a key of another run", "f", "src", forkStart("f", "src", 2, foreign), foreign, at, seams.ErrForkPrefix},
			{"through a key no run holds", "f", "src", forkStart("f", "src", 2, ulid.Make()), ulid.Make(), at, seams.ErrForkPrefix},
			{"one event fewer than there are", "f", "src", forkStart("f", "src", 2, source[at].ID), source[at].ID, at - 1, seams.ErrForkPrefix},
			{"one event more than there are", "f", "src", forkStart("f", "src", 2, source[at].ID), source[at].ID, at + 1, seams.ErrForkPrefix},
			{"a negative count", "f", "src", forkStart("f", "src", 0, ulid.ULID{}), ulid.ULID{}, -1, seams.ErrForkPrefix},
			{"nothing to copy and a count", "f", "src", forkStart("f", "src", 0, ulid.ULID{}), ulid.ULID{}, 1, seams.ErrForkPrefix},
			{"a start naming another run", "f", "src", forkStart("g", "src", 2, source[at].ID), source[at].ID, at, nil},
			{"an invalid start", "f", "src", events.RunStarted{RunID: "f"}, source[at].ID, at, nil},
			{"an invalid run id", "f\x00", "src", forkStart("f\x00", "src", 2, source[at].ID), source[at].ID, at, seams.ErrInvalidRunID},
			{"an invalid source id", "f", "", forkStart("f", "", 2, source[at].ID), source[at].ID, at, seams.ErrInvalidRunID},
		} {
			before := listing(t, s)
			envs, err := s.ForkRun(ctx, c.run, c.started, c.source, c.through, c.n)
			switch {
			case err == nil:
				t.Errorf("%s: forked (%d events), want a refusal", c.name, len(envs))
				continue
			case c.want != nil && !errors.Is(err, c.want):
				t.Errorf("%s: got %v, want %v", c.name, err, c.want)
			case err.Error() == "":
				t.Errorf("%s: an error without a word", c.name)
			}
			if after := listing(t, s); !reflect.DeepEqual(after, before) {
				t.Errorf("%s: the refusal changed the listing:\n got %v\nwant %v", c.name, after, before)
			}
			if seams.ValidRunID(c.run) == nil && c.run != "src" && c.run != "other" {
				if got := mustLoad(t, s, c.run); len(got) != 0 {
					t.Errorf("%s: the refusal left %d events", c.name, len(got))
				}
			}
		}
		if got := mustLoad(t, s, "src"); !sameEvents(got, source) {
			t.Fatal("the refusals changed the source's stream")
		}
		// Nothing of them is in the way of the fork they refused.
		got := mustFork(t, s, "f", forkStart("f", "src", 2, source[at].ID), "src", source[at].ID, at)
		sound(t, "f", mustLoad(t, s, "f"), 2)
		if len(got) != 1+at {
			t.Fatalf("the fork after the refusals holds %d events, want %d", len(got), 1+at)
		}
	})

	t.Run("ExactlyOneOfConcurrentForksOntoOneRunWins", func(t *testing.T) {
		s := open(t)
		mustAppend(t, s, "src", SoundStream("src")...)
		source := mustLoad(t, s, "src")
		exactlyOneWins(t, "concurrent forks", seams.ErrRunExists, func(i int) error {
			started := forkStart("race", "src", 2, source[7].ID)
			started.ParameterSnapshot = map[string]string{"who": fmt.Sprint(i)}
			if i%5 == 0 { // a plain start racing the forks
				_, err := s.Append(ctx, "race", ulid.ULID{}, events.RunStarted{RunID: "race", SchemaVersion: events.CurrentSchemaVersion})
				return err
			}
			_, err := s.ForkRun(ctx, "race", started, "src", source[7].ID, 7)
			return err
		})
		if got := mustLoad(t, s, "race"); len(got) != 1 && len(got) != 8 {
			t.Fatalf("the race left %d events, want one start or one fork", len(got))
		}
	})

	t.Run("TheSourceGoesOnAlone", func(t *testing.T) {
		s := open(t)
		src := SoundStream("src")
		mustAppend(t, s, "src", src[:8]...)
		source := mustLoad(t, s, "src")
		mustFork(t, s, "f", forkStart("f", "src", 2, source[7].ID), "src", source[7].ID, 7)
		fork := mustLoad(t, s, "f")
		mustAppend(t, s, "src", src[8:]...)
		if got := mustLoad(t, s, "f"); !sameEvents(got, fork) {
			t.Fatal("appending to the source changed its fork")
		}
		if got := mustLoad(t, s, "src"); len(got) != len(src) {
			t.Fatalf("the source holds %d events, want %d", len(got), len(src))
		}
		// A source that went on is forked up to through, whatever follows.
		mustFork(t, s, "g", forkStart("g", "src", 2, source[7].ID), "src", source[7].ID, 7)
		if got := mustLoad(t, s, "g"); len(got) != 8 {
			t.Fatalf("a fork through event 7 of a source that went on holds %d events, want 8", len(got))
		}
	})

	t.Run("AForkIsListedLikeAnyRun", func(t *testing.T) {
		s := open(t)
		src := SoundStream("src")
		mustAppend(t, s, "src", src...)
		source := mustLoad(t, s, "src")
		plain := forkStart("plain-f", "src", 3, source[10].ID)
		mustFork(t, s, "plain-f", plain, "src", source[10].ID, 10)
		queued := forkStart("alpha-f", "src", 1, source[4].ID)
		queued.Agent = "alpha"
		mustFork(t, s, "alpha-f", queued, "src", source[4].ID, 4)
		// Through the source's end: a finished fork, queued for nobody.
		ended := forkStart("alpha-ended", "src", 4, source[14].ID)
		ended.Agent = "alpha"
		mustFork(t, s, "alpha-ended", ended, "src", source[14].ID, 14)
		for _, run := range []string{"plain-f", "alpha-f", "alpha-ended"} {
			var want seams.RunInfo
			for _, env := range mustLoad(t, s, run) {
				want.Apply(env)
			}
			got := listedRun(t, s, run)
			if d, ok := s.(seams.RunDescriber); ok {
				if described := describedRun(t, d, run); !reflect.DeepEqual(described, got) {
					t.Errorf("run %s: Describe gives %+v, Runs lists %+v", run, described, got)
				}
			}
			if got.Steps != want.Steps || got.Events != want.Events || got.LastID != want.LastID || got.StopReason != want.StopReason ||
				!got.FirstEvent.Equal(want.FirstEvent) || !got.LastEvent.Equal(want.LastEvent) {
				t.Errorf("run %s: listed %+v, its stream counts %+v", run, got, want)
			}
			finished := run == "alpha-ended"
			if (got.Status == seams.StatusFinished) != finished {
				t.Errorf("run %s: listed %s, want finished %v", run, got.Status, finished)
			}
			if _, ok := s.(seams.RunQueue); ok {
				if agent := map[bool]string{true: "", false: strings.TrimSuffix(strings.TrimSuffix(run, "-f"), "plain")}[finished]; got.Agent != agent {
					t.Errorf("run %s: listed for agent %q, want %q", run, got.Agent, agent)
				}
			}
		}
		if _, err := s.Append(ctx, "alpha-ended", tail(t, s, "alpha-ended"), SoundStream("alpha-ended")[1]); !errors.Is(err, seams.ErrRunFinished) {
			t.Errorf("an append to a fork that copied its source's end: %v, want ErrRunFinished", err)
		}
		if q, ok := s.(seams.RunQueue); ok {
			wantClaimed(t, q, []string{"alpha"}, 10, "alpha-f")
		}
	})

	t.Run("AForkGoesOnAfterItsLastKeyUnderItsDriver", func(t *testing.T) {
		s := open(t)
		mustAppend(t, s, "src", forkSource("src")...)
		source := mustLoad(t, s, "src")
		// The driver reserves the new run, forks it and drives it, as
		// engine.Fork does.
		release := lockedRun(t, s, "f")
		got := mustFork(t, s, "f", forkStart("f", "src", 2, source[7].ID), "src", source[7].ID, 7)
		if info := listedRun(t, s, "f"); info.Owner == "" || info.Status != seams.StatusRunning {
			t.Errorf("the fork its driver reserved is listed %s, held by %q, want running, held", info.Status, info.Owner)
		}
		if v, err := recovery.Classify("f", mustLoad(t, s, "f")); err != nil || v.Step != 2 {
			t.Fatalf("the fork classifies at step %d (%v), want 2, sound", v.Step, err)
		}
		rest := forkSource("f")[8:]
		for _, after := range []ulid.ULID{{}, source[7].ID, source[14].ID, got[len(got)-2].ID} {
			if _, err := s.Append(ctx, "f", after, rest[0]); err == nil {
				t.Fatalf("an append to the fork after %s, not its last key, succeeded", after)
			}
		}
		mustAppend(t, s, "f", rest...)
		stream := mustLoad(t, s, "f")
		sound(t, "f", stream, 2)
		v, err := recovery.Classify("f", stream)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := recovery.Classify("src", source)
		if !SameSteps(v.Steps(), want.Steps()) || v.Result == nil {
			t.Errorf("the fork driven to its end has steps %+v, want the source's %+v, finished", v.Steps(), want.Steps())
		}
		release()
		if info := listedRun(t, s, "f"); info.Status != seams.StatusFinished || info.Steps != 4 || info.Events != len(stream) {
			t.Errorf("the fork driven to its end is listed %+v", info)
		}
	})

	// A store that keeps a step's reply as a reference to the run's latest
	// reply must know the fork's: the prefix's, not the source's now.
	t.Run("AStepAfterTheForkSeesThePrefixsLatestReply", func(t *testing.T) {
		s := open(t)
		mustAppend(t, s, "src", forkSource("src")[:8]...) // its latest reply step 1's
		source := mustLoad(t, s, "src")
		for _, c := range []struct {
			name string
			at   int    // the last event copied
			raw  string // the step's raw output appended after it
		}{
			{"the reply copied last", 2, forkSource("src")[2].(events.ModelCallResult).Reply.Content},
			{"a reply the source has after the prefix", 4, forkSource("src")[6].(events.ModelCallResult).Reply.Content},
		} {
			run := "f-" + strings.ReplaceAll(c.name, " ", "-")
			mustFork(t, s, run, forkStart(run, "src", stepsIn(source[:c.at+1]), source[c.at].ID), "src", source[c.at].ID, c.at)
			step := forkSource(run)[4].(events.StepCompleted)
			step.Step.RawOutput, step.Step.ContentChars = c.raw, len([]rune(c.raw))
			mustAppend(t, s, run, step)
			stream := mustLoad(t, s, run)
			if got := stream[len(stream)-1].Event.(events.StepCompleted).Step.RawOutput; got != c.raw {
				t.Errorf("%s: the step appended after the fork reads back %.40q…, was %.40q…", c.name, got, c.raw)
			}
		}
	})

	t.Run("AForkIsForkedAgain", func(t *testing.T) {
		s := open(t)
		mustAppend(t, s, "src", forkSource("src")...)
		source := mustLoad(t, s, "src")
		mustFork(t, s, "f1", forkStart("f1", "src", 2, source[7].ID), "src", source[7].ID, 7)
		mustAppend(t, s, "f1", forkSource("f1")[8:11]...) // step 2, the fork's own
		f1 := mustLoad(t, s, "f1")
		started := forkStart("f2", "f1", 3, f1[10].ID)
		started.Fork.Ancestry = []events.Ancestor{{Run: "src", Steps: 2}}
		mustFork(t, s, "f2", started, "f1", f1[10].ID, 10)
		f2 := mustLoad(t, s, "f2")
		sound(t, "f2", f2, 3)
		for i := 1; i < len(f2); i++ {
			if !reflect.DeepEqual(f2[i].Event, f1[i].Event) {
				t.Errorf("event %d of the fork of a fork differs from its source's", i)
			}
		}
		sameValues(t, values(t, s, "f2"), values(t, s, "f1"), 10)
		sameValues(t, values(t, s, "f2")[:8], values(t, s, "src"), 7)
	})
}

// forkSource is SoundStream with its first two steps' replies long enough
// that a store may keep each step's raw output as a reference to its reply.
func forkSource(runID string) []events.Event {
	stream := LongReplyStream(runID)
	mr, sc := stream[6].(events.ModelCallResult), stream[7].(events.StepCompleted)
	reply := *mr.Reply
	reply.Content = "call nope, " + strings.Repeat("because the listing said so; ", 40)
	mr.Reply = &reply
	sc.Step.RawOutput, sc.Step.ContentChars = reply.Content, len([]rune(reply.Content))
	stream[6], stream[7] = mr, sc
	return stream
}

// forkStart is the RunStarted of run forked from source at step, the last
// event copied through (zero: none).
func forkStart(run, source string, step int, through ulid.ULID) events.RunStarted {
	origin := &events.ForkOrigin{Run: source, Step: step}
	if through != (ulid.ULID{}) {
		origin.LastKey = through.String()
	}
	return events.RunStarted{RunID: run, SchemaVersion: events.CurrentSchemaVersion, Fork: origin,
		ParameterSnapshot: map[string]string{"budget.max_steps": "8", "model.name": "scripted", "parser.kind": "fenced"}}
}

// stepsIn is how many steps stream completes.
func stepsIn(stream []events.Envelope) int {
	n := 0
	for _, env := range stream {
		if env.Kind == events.KindStepCompleted {
			n++
		}
	}
	return n
}

// mustFork forks run from source; any error fails the test.
func mustFork(t *testing.T, s ForkStore, run string, started events.RunStarted, source string, through ulid.ULID, n int) []events.Envelope {
	t.Helper()
	envs, err := s.ForkRun(context.Background(), run, started, source, through, n)
	if err != nil {
		t.Fatalf("ForkRun(%q from %q through %s, %d events): %v", run, source, through, n, err)
	}
	return envs
}

// sameValues fails the test unless the fork's values 1..n are the source's,
// byte for byte but for the seal (its last four bytes).
func sameValues(t *testing.T, fork, source [][]byte, n int) {
	t.Helper()
	if len(fork) != 1+n || len(source) < 1+n {
		t.Fatalf("the fork stores %d values, want %d; its source %d", len(fork), 1+n, len(source))
	}
	for i := 1; i <= n; i++ {
		f, s := fork[i], source[i]
		if len(f) < 4 || len(f) != len(s) || !bytes.Equal(f[:len(f)-4], s[:len(s)-4]) {
			t.Errorf("value %d: the fork stores %d bytes that are not its source's %d", i, len(f), len(s))
		}
	}
}

// sound fails the test unless stream is a sound log of run whose first
// steps steps are copied.
func sound(t *testing.T, run string, stream []events.Envelope, steps int) {
	t.Helper()
	v, err := recovery.Classify(run, stream)
	if err != nil {
		t.Fatalf("the fork %q is not sound: %v", run, err)
	}
	if v.Step < steps {
		t.Fatalf("the fork %q has %d steps, want at least %d", run, v.Step, steps)
	}
}

// listing is every run s lists, its data and agent (what a refused fork
// must leave as it was).
func listing(t *testing.T, s ForkStore) []string {
	t.Helper()
	runs, err := s.Runs(context.Background())
	if err != nil {
		t.Fatalf("Runs: %v", err)
	}
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = fmt.Sprintf("%s %s %d steps %d events %s last %s agent %q", r.RunID, r.Status, r.Steps, r.Events, r.StopReason, r.LastID, r.Agent)
	}
	return out
}
