package kv_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// holdLockEnv makes the test binary a child that holds a store open.
const holdLockEnv = "POLYLOOP_KV_HOLD_LOCK"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdLockEnv); path != "" {
		s, err := kv.Open(path, kv.Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("locked")
		bufio.NewReader(os.Stdin).ReadString('\n') // hold until the parent says so
		s.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func openTemp(t *testing.T, o kv.Options) *kv.Store {
	t.Helper()
	s, err := kv.Open(filepath.Join(t.TempDir(), "runs.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreKeepsTheRunStoreContract(t *testing.T) {
	proptest.RunStoreContract(t, func(t *testing.T) seams.RunStore { return openTemp(t, kv.Options{}) })
}

// TestStoreKeepsTheRunLeaseContract: one process holds a kv file, so a
// fleet is one Store shared by every driver; its reservations never
// expire.
func TestStoreKeepsTheRunLeaseContract(t *testing.T) {
	proptest.RunLeaseContract(t, func(t *testing.T, n int, _ time.Duration) ([]seams.RunStore, func(int)) {
		s := openTemp(t, kv.Options{})
		fleet := make([]seams.RunStore, n)
		for i := range fleet {
			fleet[i] = s
		}
		return fleet, nil
	})
}

// TestStoreKeepsTheRunQueueContract: one process holds a kv file, so
// there is no second store with an owner of its own.
func TestStoreKeepsTheRunQueueContract(t *testing.T) {
	proptest.RunQueueContract(t, func(t *testing.T) proptest.QueueStore { return openTemp(t, kv.Options{}) }, nil)
}

func TestFileIsCreatedWithMode0600(t *testing.T) {
	s := openTemp(t, kv.Options{})
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestFileHeldByAnotherProcessFailsAfterBoundedWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdLockEnv+"="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "locked" {
		t.Fatalf("child: %q", line)
	}
	for _, o := range []kv.Options{{LockTimeout: 100 * time.Millisecond}, {ReadOnly: true, LockTimeout: 100 * time.Millisecond}, {}} {
		_, err := kv.Open(path, o)
		if !errors.Is(err, kv.ErrLocked) {
			t.Fatalf("open %+v: got %v, want ErrLocked", o, err)
		}
		// The wait it names is the one configured, DefaultLockTimeout when unset.
		wait := o.LockTimeout
		if wait == 0 {
			wait = kv.DefaultLockTimeout
		}
		if !strings.Contains(err.Error(), "locked by another process") || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), fmt.Sprintf("waited %s", wait)) {
			t.Errorf("error does not say what happened: %v", err)
		}
	}
}

// sampleStoreFile writes a sample store in a new directory and returns the
// directory, the file's path and its bytes.
func sampleStoreFile(t *testing.T) (dir, path string, file []byte) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "good.db")
	writeSampleStore(t, path)
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return dir, path, file
}

func writeSampleStore(t *testing.T, path string) {
	t.Helper()
	s, err := kv.Open(path, kv.Options{PageSize: 4096}) // truncation points below assume 4 KiB pages
	if err != nil {
		t.Fatal(err)
	}
	for r := range 20 {
		id := fmt.Sprintf("run-%02d", r)
		if _, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)...); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// readAll opens path and reads every run; it reports the first error.
func readAll(path string, o kv.Options) error {
	s, err := kv.Open(path, o)
	if err != nil {
		return err
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	if err != nil {
		return err
	}
	for _, r := range runs {
		got, err := s.Load(context.Background(), r.RunID)
		if err != nil {
			return err
		}
		want := proptest.SoundStream(r.RunID)
		if len(got) != len(want) {
			return fmt.Errorf("run %s: %d events, want %d", r.RunID, len(got), len(want))
		}
		for i := range want {
			if !reflect.DeepEqual(got[i].Event, want[i]) {
				return fmt.Errorf("run %s: event %d differs", r.RunID, i)
			}
		}
	}
	if len(runs) != 20 {
		return fmt.Errorf("%d runs listed", len(runs))
	}
	return nil
}

// TestDamagedFilesGiveErrorsNotPanics: truncation at many points and random
// bytes are reported as errors by Open, Runs or Load.
func TestDamagedFilesGiveErrorsNotPanics(t *testing.T) {
	dir, good, whole := sampleStoreFile(t)
	if err := readAll(good, kv.Options{ReadOnly: true}); err != nil {
		t.Fatalf("sound file: %v", err)
	}
	ro, err := kv.Open(good, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	used, err := ro.DataSize()
	ro.Close()
	if err != nil || used >= int64(len(whole)) {
		t.Fatalf("the sample uses %d of the file's %d bytes (%v): no unused tail to cut", used, len(whole), err)
	}
	// Cuts into the used pages (fractions of them) must be errors; an empty
	// file is not a store at all (read-write too: it is not made a new
	// store). bbolt grows files ahead of use, so a cut in the unused tail
	// leaves a whole store, and every run must read back intact.
	for _, frac := range []int{0, 1, 5, 10, 25, 50, 75, 90, 99, -1} {
		cut := used * int64(frac) / 100
		if frac < 0 {
			cut = (used + int64(len(whole))) / 2
		}
		for _, ro := range []bool{true, false} {
			name := fmt.Sprintf("truncated to %d%% of the used bytes readonly=%v", frac, ro)
			path := filepath.Join(dir, fmt.Sprintf("trunc-%d-%v.db", frac, ro))
			if err := os.WriteFile(path, whole[:cut], 0o600); err != nil {
				t.Fatal(err)
			}
			err := readAll(path, kv.Options{ReadOnly: ro})
			if frac < 0 {
				if err != nil {
					t.Errorf("cut in the unused tail, readonly=%v: %v", ro, err)
				}
				continue
			}
			if err == nil {
				t.Errorf("%s: no error", name)
			}
			want := kv.ErrCorrupt
			if frac == 0 {
				want = kv.ErrNotAStore
			}
			if err != nil && !errors.Is(err, want) {
				t.Errorf("%s: got %v, want %v", name, err, want)
			}
		}
	}
	random := make([]byte, len(whole))
	rand.Read(random)
	path := filepath.Join(dir, "random.db")
	os.WriteFile(path, random, 0o600)
	for _, ro := range []bool{true, false} {
		err := readAll(path, kv.Options{ReadOnly: ro})
		if !errors.Is(err, kv.ErrNotAStore) {
			t.Errorf("random bytes (readonly=%v): got %v, want ErrNotAStore", ro, err)
		}
	}
}

func TestReadOnlyStoreRefusesWritesAndMissingFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := kv.Open(filepath.Join(dir, "absent.db"), kv.Options{ReadOnly: true}); err == nil {
		t.Fatal("read-only open of a missing file succeeded")
	}
	path := filepath.Join(dir, "s.db")
	writeSampleStore(t, path)
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Append(context.Background(), "run-00", ulid.ULID{}, proptest.SoundStream("run-00")[0]); !errors.Is(err, kv.ErrReadOnly) {
		t.Fatalf("got %v, want ErrReadOnly", err)
	}
	// Two readers may share the file.
	s2, err := kv.Open(path, kv.Options{ReadOnly: true, LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	s2.Close()
}

func TestRunsListsTheIndex(t *testing.T) {
	s := openTemp(t, kv.Options{})
	ctx := context.Background()
	full := proptest.SoundStream("done")
	if _, err := s.Append(ctx, "done", ulid.ULID{}, full...); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "open", ulid.ULID{}, proptest.SoundStream("open")[:5]...); err != nil {
		t.Fatal(err)
	}
	runs, err := s.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs", len(runs))
	}
	d, o := runs[0], runs[1]
	if d.RunID != "done" || d.Status != kv.StatusFinished || d.Steps != 4 || d.StopReason != events.StopAgentFinished || d.Events != len(full) {
		t.Errorf("finished run: %+v", d)
	}
	// Nobody holds the unfinished run, and it was started for no agent:
	// nothing continues it until engine.Resume does.
	if o.RunID != "open" || o.Status != seams.StatusInterrupted || o.Steps != 1 || o.StopReason != "" || o.Events != 5 {
		t.Errorf("unfinished run: %+v", o)
	}
	if d.FirstEvent.IsZero() || d.LastEvent.Before(d.FirstEvent) {
		t.Errorf("event times: %v .. %v", d.FirstEvent, d.LastEvent)
	}
	// A driver of this process holds it: running, held by this Store.
	release, err := s.LockRun("open")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if runs, err = s.Runs(ctx); err != nil {
		t.Fatal(err)
	}
	if o := runs[1]; o.Status != kv.StatusRunning || o.Owner != s.Owner() {
		t.Errorf("unfinished run a driver holds: %+v", o)
	}
}

// TestConcurrentAppendsShareTransactions: with many callers, fewer durable
// transactions than appends are committed, and every caller's events are
// there when it returns.
func TestConcurrentAppendsShareTransactions(t *testing.T) {
	s := openTemp(t, kv.Options{})
	ctx := context.Background()
	const runs = 64
	before := s.Transactions()
	var wg sync.WaitGroup
	for r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("g%02d", r)
			var tail ulid.ULID
			for i, ev := range proptest.SoundStream(id) {
				envs, err := s.Append(ctx, id, tail, ev)
				if err != nil {
					t.Error(err)
					return
				}
				tail = envs[0].ID
				got, err := s.Load(ctx, id)
				if err != nil || len(got) != i+1 {
					t.Errorf("run %s: after append %d Load has %d events (%v)", id, i, len(got), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	appends := uint64(runs * len(proptest.SoundStream("x")))
	txs := s.Transactions() - before
	t.Logf("%d appends in %d transactions", appends, txs)
	if txs >= appends {
		t.Errorf("no group commit: %d transactions for %d appends", txs, appends)
	}
}

func TestClosedStoreRefusesWork(t *testing.T) {
	s := openTemp(t, kv.Options{})
	s.Close()
	ctx := context.Background()
	if _, err := s.Append(ctx, "r", ulid.ULID{}, proptest.SoundStream("r")[0]); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Append: %v", err)
	}
	if _, err := s.Load(ctx, "r"); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Load: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestOversizedRunIDIsRefusedAndOthersInTheGroupLand: a run id longer than
// the rule allows (seams.MaxRunIDBytes, far below bbolt's key limit) fails
// with seams.ErrInvalidRunID and a reason and writes nothing, while an
// append of another run made at the same time lands.
func TestOversizedRunIDIsRefusedAndOthersInTheGroupLand(t *testing.T) {
	s := openTemp(t, kv.Options{})
	ctx := context.Background()
	long := strings.Repeat("x", 40_000)
	var wg sync.WaitGroup
	var errLong, errOK error
	wg.Add(2)
	go func() { defer wg.Done(); _, errLong = s.Append(ctx, long, ulid.ULID{}, proptest.SoundStream(long)[0]) }()
	go func() {
		defer wg.Done()
		_, errOK = s.Append(ctx, "fine", ulid.ULID{}, proptest.SoundStream("fine")[0])
	}()
	wg.Wait()
	if !errors.Is(errLong, seams.ErrInvalidRunID) || !strings.Contains(errLong.Error(), "longer than the 1024-byte limit") {
		t.Fatalf("long run id: %v", errLong)
	}
	if errOK != nil {
		t.Fatal(errOK)
	}
	if got, _ := s.Load(ctx, "fine"); len(got) != 1 {
		t.Fatalf("the other append has %d events", len(got))
	}
	runs, _ := s.Runs(ctx)
	if len(runs) != 1 {
		t.Fatalf("%d runs listed", len(runs))
	}
	// The limit itself is a valid run id.
	limit := strings.Repeat("y", seams.MaxRunIDBytes)
	if _, err := s.Append(ctx, limit, ulid.ULID{}, proptest.SoundStream(limit)[0]); err != nil {
		t.Fatalf("a run id of exactly %d bytes: %v", seams.MaxRunIDBytes, err)
	}
}

func TestRunDeleterContract(t *testing.T) {
	proptest.RunDeleterContract(t, func(t *testing.T) proptest.DeletingStore {
		s, err := kv.Open(filepath.Join(t.TempDir(), "s.db"), kv.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
