package kv

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// openQueueStore opens a new store of the format at a path of its own.
func openQueueStore(t *testing.T, format string) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "q.db"), Options{format: format})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// reopen closes s and opens its file again (a new Open: a new Owner).
func reopen(t *testing.T, s *Store, o Options) *Store {
	t.Helper()
	s.Close()
	s, err := Open(s.Path(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// agentStart is runID's RunStarted, started for agent ("" for none).
func agentStart(runID, agent string) events.RunStarted {
	started := proptest.SoundStream(runID)[0].(events.RunStarted)
	started.Agent = agent
	return started
}

// submitRun appends runID's RunStarted for agent, as a pool's Submit
// does, and returns the run's tail.
func submitRun(t *testing.T, s *Store, runID, agent string) ulid.ULID {
	t.Helper()
	envs, err := s.Append(context.Background(), runID, ulid.ULID{}, agentStart(runID, agent))
	if err != nil {
		t.Fatal(err)
	}
	return envs[0].ID
}

// finishRun appends the rest of a sound stream after tail: a step, and
// more, and RunFinished.
func finishRun(t *testing.T, s *Store, runID string, tail ulid.ULID) {
	t.Helper()
	if _, err := s.Append(context.Background(), runID, tail, proptest.SoundStream(runID)[1:]...); err != nil {
		t.Fatal(err)
	}
}

// describeRun is Describe's answer, which must not fail.
func describeRun(t *testing.T, s *Store, runID string) RunInfo {
	t.Helper()
	info, err := s.Describe(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// listed is runID's entry in Runs.
func listed(t *testing.T, s *Store, runID string) RunInfo {
	t.Helper()
	runs, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range runs {
		if info.RunID == runID {
			return info
		}
	}
	t.Fatalf("Runs does not list %q", runID)
	return RunInfo{}
}

// queueKeys closes s and lists its file's queue bucket's keys ("absent"
// when there is no bucket).
func queueKeys(t *testing.T, s *Store) []string {
	t.Helper()
	s.Close()
	db, err := bolt.Open(s.Path(), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var keys []string
	db.View(func(tx *bolt.Tx) error {
		q := tx.Bucket(queueBucket)
		if q == nil {
			keys = []string{"absent"}
			return nil
		}
		return q.ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil })
	})
	return keys
}

// TestARunStartedForAnAgentIsQueuedUntilItFinishes: the append of a
// RunStarted naming an agent writes the run's queue entry, and the append
// of its RunFinished removes it, in that append's one transaction; a run
// without an agent, and a whole run appended at once, leave no entry. A
// refused finishing append leaves the run queued.
func TestARunStartedForAnAgentIsQueuedUntilItFinishes(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			s := openQueueStore(t, format)
			ctx := context.Background()
			a := submitRun(t, s, "a", "alpha")
			submitRun(t, s, "b", "alpha")
			submitRun(t, s, "plain", "")
			whole := proptest.SoundStream("whole")
			whole[0] = agentStart("whole", "alpha")
			if _, err := s.Append(ctx, "whole", ulid.ULID{}, whole...); err != nil {
				t.Fatal(err)
			}
			if info := describeRun(t, s, "a"); info.Agent != "alpha" || info.Status != seams.StatusAwaiting {
				t.Errorf("a submitted run: %+v, want agent alpha, awaiting", info)
			}
			if got := queueKeys(t, s); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("queue holds %q, want the two unfinished agent runs", got)
			}
			s = reopen(t, s, Options{})

			// A finishing append refused (its tail moved) leaves the run queued.
			if _, err := s.Append(ctx, "a", ulid.ULID{}, proptest.SoundStream("a")[1:]...); !errors.Is(err, seams.ErrTailMoved) {
				t.Fatalf("got %v, want ErrTailMoved", err)
			}
			before := s.Transactions()
			finishRun(t, s, "a", a)
			if n := s.Transactions() - before; n != 1 {
				t.Errorf("the finishing append took %d transactions, want 1", n)
			}
			if info := describeRun(t, s, "a"); info.Status != StatusFinished || info.Agent != "" {
				t.Errorf("a finished run: %+v, want finished and out of the queue", info)
			}
			if got := queueKeys(t, s); !slices.Equal(got, []string{"b"}) {
				t.Fatalf("queue holds %q, want b alone", got)
			}
		})
	}
}

// TestARunStartedForAnAgentNoClaimCouldNameIsRefused: an agent name
// seams.ValidAgent refuses (ClaimRuns refuses it too) is refused with
// seams.ErrInvalidAgent, writing nothing.
func TestARunStartedForAnAgentNoClaimCouldNameIsRefused(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	for _, agent := range []string{strings.Repeat("a", seams.MaxAgentBytes+1), "tab\there", "\xff"} {
		if _, err := s.Append(ctx, "r", ulid.ULID{}, agentStart("r", agent)); !errors.Is(err, seams.ErrInvalidAgent) {
			t.Errorf("agent %.20q: got %v, want ErrInvalidAgent", agent, err)
		}
	}
	if got, err := s.Load(ctx, "r"); err != nil || len(got) != 0 {
		t.Errorf("a refused start wrote %d events (%v)", len(got), err)
	}
}

// TestRunsAndDescribeTellWhoHoldsARun: a listing and Describe fill the
// queue and hold of every run and its liveness — a table of the states a
// Store tells without claims (ClaimRuns' tests tell those).
func TestRunsAndDescribeTellWhoHoldsARun(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	for _, id := range []string{"awaiting", "awaiting-held"} {
		submitRun(t, s, id, "alpha")
	}
	for _, id := range []string{"interrupted", "held"} {
		submitRun(t, s, id, "")
	}
	if _, err := s.Append(ctx, "finished", ulid.ULID{}, proptest.SoundStream("finished")...); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"held", "awaiting-held"} {
		release, err := s.LockRun(id)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
	}
	for _, c := range []struct {
		run    string
		status seams.RunStatus
		agent  string
		owner  string
	}{
		{"awaiting", seams.StatusAwaiting, "alpha", ""},
		{"awaiting-held", seams.StatusRunning, "alpha", s.Owner()},
		{"interrupted", seams.StatusInterrupted, "", ""},
		{"held", seams.StatusRunning, "", s.Owner()},
		{"finished", seams.StatusFinished, "", ""},
	} {
		for how, info := range map[string]RunInfo{"Describe": describeRun(t, s, c.run), "Runs": listed(t, s, c.run)} {
			if info.Status != c.status || info.Agent != c.agent || info.Owner != c.owner || !info.LeaseExpires.IsZero() {
				t.Errorf("%s %q: %+v, want %s, agent %q, owner %q, no expiry", how, c.run, info, c.status, c.agent, c.owner)
			}
		}
	}
	if _, err := s.Describe(ctx, "nobody"); !errors.Is(err, seams.ErrNoRun) {
		t.Errorf("Describe of a run never written: %v, want ErrNoRun", err)
	}
	if _, err := s.Describe(ctx, ""); !errors.Is(err, seams.ErrInvalidRunID) {
		t.Errorf("Describe of an empty run id: %v, want ErrInvalidRunID", err)
	}
}

// TestDescribeListsADamagedIndexEntryAsCorrupt: a run whose index entry
// fails its checksum is described as Runs lists it.
func TestDescribeListsADamagedIndexEntryAsCorrupt(t *testing.T) {
	s := openQueueStore(t, formatLog)
	submitRun(t, s, "r", "alpha")
	s.Close()
	rawUpdate(t, s.Path(), func(tx *bolt.Tx) error {
		index := tx.Bucket(indexBucket)
		v := index.Get(entryOf(tx, "r"))
		return index.Put(entryOf(tx, "r"), []byte(strings.Replace(string(v), "running", "runninG", 1)))
	})
	s = reopen(t, s, Options{})
	for how, info := range map[string]RunInfo{"Describe": describeRun(t, s, "r"), "Runs": listed(t, s, "r")} {
		if info.Status != StatusCorrupt {
			t.Errorf("%s: %+v, want corrupt", how, info)
		}
	}
}

// TestAFileWithoutAQueueReadsAsAnEmptyQueue: a file made before the queue
// bucket opens read-only as it is, with no run queued; a read-write Open
// adds the bucket, and a run started for an agent then is queued.
func TestAFileWithoutAQueueReadsAsAnEmptyQueue(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			s := openQueueStore(t, format)
			submitRun(t, s, "old", "")
			s.Close()
			rawUpdate(t, s.Path(), func(tx *bolt.Tx) error { return tx.DeleteBucket(queueBucket) })
			s = reopen(t, s, Options{ReadOnly: true})
			if info := describeRun(t, s, "old"); info.Status != seams.StatusInterrupted {
				t.Errorf("read-only, without a queue: %+v, want interrupted", info)
			}
			if got := queueKeys(t, s); !slices.Equal(got, []string{"absent"}) {
				t.Fatalf("a read-only open wrote the queue bucket: %q", got)
			}
			s = reopen(t, s, Options{})
			submitRun(t, s, "new", "alpha")
			if info := describeRun(t, s, "new"); info.Status != seams.StatusAwaiting {
				t.Errorf("a run started after a read-write open: %+v, want awaiting", info)
			}
		})
	}
}

// TestTheQueueOutlivesCompaction: queue entries are copied by Compact, in
// the log and from a format 1 file moved to it; a run deleted leaves no
// entry behind.
func TestTheQueueOutlivesCompaction(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			s := openQueueStore(t, format)
			ctx := context.Background()
			submitRun(t, s, "kept", "alpha")
			submitRun(t, s, "deleted", "alpha")
			if err := s.DeleteRun(ctx, "deleted", true); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if _, err := Compact(s.Path(), Options{}); err != nil {
				t.Fatal(err)
			}
			if got := queueKeys(t, s); !slices.Equal(got, []string{"kept"}) {
				t.Fatalf("after compaction the queue holds %q, want kept alone", got)
			}
			s = reopen(t, s, Options{})
			if info := describeRun(t, s, "kept"); info.Agent != "alpha" || info.Status != seams.StatusAwaiting {
				t.Errorf("after compaction: %+v, want agent alpha, awaiting", info)
			}
			// A run started again under a deleted run's id starts afresh.
			submitRun(t, s, "deleted", "")
			if info := describeRun(t, s, "deleted"); info.Agent != "" || info.Status != seams.StatusInterrupted {
				t.Errorf("a deleted run's id started again without an agent: %+v", info)
			}
		})
	}
}

// TestADamagedQueueEntryIsNeitherTrustedNorFatal: a queue entry that
// fails its checksum or does not decode — whatever the damage — opens,
// lists the run interrupted with the damage in LastError (its agent and
// holder unknown), and never panics.
func TestADamagedQueueEntryIsNeitherTrustedNorFatal(t *testing.T) {
	for _, d := range queueDamages {
		t.Run(d.name, func(t *testing.T) {
			s := damagedQueue(t, d.damage)
			for how, info := range map[string]RunInfo{"Describe": describeRun(t, s, "r"), "Runs": listed(t, s, "r")} {
				if info.Status != seams.StatusInterrupted || info.Agent != "" || info.Owner != "" || !strings.Contains(info.LastError, "queue entry") {
					t.Errorf("%s: %+v, want interrupted, no agent or owner, the damage in LastError", how, info)
				}
			}
		})
	}
}

// queueDamages are ways a queue entry is damaged: each makes run "r"'s
// entry, given it and run "o"'s (an id as long), one that fails its
// checksum or does not decode.
var queueDamages = []struct {
	name   string
	damage func(r, other []byte) []byte
}{
	{"a bit of the agent flipped", func(r, _ []byte) []byte { r[bytes.Index(r, []byte("alpha"))+2] ^= 0x04; return r }},
	{"the checksum changed", func(r, _ []byte) []byte { r[len(r)-1]++; return r }},
	{"cut short", func(r, _ []byte) []byte { return r[:len(r)/2] }},
	{"empty", func(_, _ []byte) []byte { return []byte{} }},
	{"not msgpack", func(_, _ []byte) []byte { return []byte("\xc1\xc1\xc1") }},
	{"a string declaring more bytes than there are", func(_, _ []byte) []byte { return []byte{0xdb, 0xff, 0xff, 0xff, 0xff} }},
	{"nested too deep", func(_, _ []byte) []byte { return []byte(strings.Repeat("\x91", 100) + "\xc0") }},
	{"trailing bytes", func(r, _ []byte) []byte { return append(r, make([]byte, maxQueuedSize)...) }},
	{"too large, though sealed", func(r, _ []byte) []byte {
		q, err := decodeQueued([]byte("r"), r)
		if err != nil {
			panic(err)
		}
		q.LastError = strings.Repeat("x", maxQueuedSize)
		q.CRC = q.checksum([]byte("r"))
		v, err := msgpack.Marshal(&q)
		if err != nil {
			panic(err)
		}
		return v
	}},
	{"another run's entry", func(_, other []byte) []byte { return other }},
}

// damagedQueue makes a store whose runs "r" and "o" were started for
// agents alpha and beta, damages r's queue entry, and opens it again.
func damagedQueue(t *testing.T, damage func(r, other []byte) []byte) *Store {
	t.Helper()
	s := openQueueStore(t, formatLog)
	submitRun(t, s, "r", "alpha")
	submitRun(t, s, "o", "beta")
	s.Close()
	rawUpdate(t, s.Path(), func(tx *bolt.Tx) error {
		q := tx.Bucket(queueBucket)
		r, other := bytes.Clone(q.Get([]byte("r"))), bytes.Clone(q.Get([]byte("o")))
		return q.Put([]byte("r"), damage(r, other))
	})
	return reopen(t, s, Options{})
}
