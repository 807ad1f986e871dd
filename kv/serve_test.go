package kv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// shortDir is a temporary directory whose path leaves room for a socket's.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// sameRead fails t unless a read through the socket returned what the
// file's did: the same events, the same error text, the same kinds.
func sameRead(t *testing.T, what string, got []events.Envelope, gotErr error, want []events.Envelope, wantErr error) {
	t.Helper()
	if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
		t.Errorf("%s: %d events through the socket, %d from the file", what, len(got), len(want))
	}
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Errorf("%s: through the socket\n  %v\nfrom the file\n  %v", what, gotErr, wantErr)
	}
	var gd, wd *events.DamageError
	for _, kind := range []error{ErrCorrupt, events.ErrCorruption, seams.ErrStreamChanged, seams.ErrInvalidRunID} {
		if errors.Is(gotErr, kind) != errors.Is(wantErr, kind) {
			t.Errorf("%s: through the socket %v is %v: %t, from the file %t", what, gotErr, kind, errors.Is(gotErr, kind), errors.Is(wantErr, kind))
		}
	}
	if errors.As(gotErr, &gd) != errors.As(wantErr, &wd) || gd != nil && len(gd.Problems) != len(wd.Problems) {
		t.Errorf("%s: the damage through the socket (%v) is not the file's (%v)", what, gotErr, wantErr)
	}
}

// plainInfo is info with its times in UTC without a monotonic reading,
// to compare listings read in two ways.
func plainInfo(info RunInfo) RunInfo {
	for _, t := range []*time.Time{&info.FirstEvent, &info.LastEvent, &info.LeaseExpires, &info.RetryAt} {
		*t = t.Round(0).UTC()
	}
	if c := info.CancelRequested; c != nil {
		cc := *c
		cc.At = cc.At.Round(0).UTC()
		info.CancelRequested = &cc
	}
	return info
}

// TestServedReadsAnswerAsTheFileDoes: through a writer's socket, Runs,
// Describe, Load and LoadAfter (from every place in the stream, with the
// right and a wrong last event) answer what the writer's own Store does,
// for a sound run and for each kind of damage — the events decoded and
// checked on the reader's side, the damage listed alike.
func TestServedReadsAnswerAsTheFileDoes(t *testing.T) {
	ctx := context.Background()
	damages := []struct {
		name   string
		format string // "" for both
		change func(tx *bolt.Tx, format, run string, stream []events.Envelope) error
	}{
		{"sound", "", nil},
		{"a bit of a value flipped", "", func(tx *bolt.Tx, format, run string, stream []events.Envelope) error {
			return changeValue(tx, format, run, stream[1], func(v []byte) { v[len(v)-10] ^= 0x10 })
		}},
		{"an event in the middle deleted", "", func(tx *bolt.Tx, format, run string, stream []events.Envelope) error {
			return deleteEvent(tx, format, run, stream[3].ID)
		}},
		{"the index entry altered", "", func(tx *bolt.Tx, format, run string, _ []events.Envelope) error {
			b := tx.Bucket(indexBucket)
			v := b.Get(entryOf(tx, run))
			return b.Put(entryOf(tx, run), []byte(strings.Replace(string(v), "running", "finishe", 1)))
		}},
		{"a link damaged", formatLog, func(tx *bolt.Tx, format, run string, stream []events.Envelope) error {
			return changeValue(tx, format, run, stream[4], func(v []byte) { v[20] ^= 1 })
		}},
	}
	for _, format := range formats {
		for _, d := range damages {
			if d.format != "" && d.format != format {
				continue
			}
			t.Run(format+"/"+d.name, func(t *testing.T) {
				path := filepath.Join(shortDir(t), "s.db")
				s, err := Open(path, Options{format: format})
				if err != nil {
					t.Fatal(err)
				}
				proptest.AppendEach(t, s, "r", proptest.LongReplyStream("r"))
				proptest.AppendEach(t, s, "other", proptest.SoundStream("other"))
				written, err := s.Load(ctx, "r")
				if err != nil {
					t.Fatal(err)
				}
				if d.change != nil {
					s.Close()
					rawUpdate(t, path, func(tx *bolt.Tx) error { return d.change(tx, format, "r", written) })
					if s, err = Open(path, Options{}); err != nil {
						t.Fatal(err)
					}
				}
				defer s.Close()
				r, err := Dial(path)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()

				want, wantErr := s.Load(ctx, "r")
				got, gotErr := r.Load(ctx, "r")
				sameRead(t, "Load", got, gotErr, want, wantErr)
				if d.change == nil && gotErr != nil {
					t.Fatalf("Load of a sound run through the socket: %v", gotErr)
				}
				for _, stop := range []int{-1, 2} { // the whole run, and a scan fn stops
					scan := func(s seams.RunScanner) (got []events.Envelope, err error) {
						err = s.Scan(ctx, "r", func(env events.Envelope) error {
							if got = append(got, env); len(got) == stop {
								return errStopScan
							}
							return nil
						})
						return got, err
					}
					want, wantErr := scan(s)
					got, gotErr := scan(r)
					sameRead(t, fmt.Sprintf("Scan stopped at %d", stop), got, gotErr, want, wantErr)
				}
				for seen := 0; seen <= len(written)+1; seen++ {
					last := ulidOf(written, seen)
					want, wantErr := s.LoadAfter(ctx, "r", seen, last)
					got, gotErr := r.LoadAfter(ctx, "r", seen, last)
					sameRead(t, fmt.Sprintf("LoadAfter %d", seen), got, gotErr, want, wantErr)
					want, wantErr = s.LoadAfter(ctx, "r", seen, written[0].ID)
					got, gotErr = r.LoadAfter(ctx, "r", seen, written[0].ID)
					sameRead(t, fmt.Sprintf("LoadAfter %d, another last event", seen), got, gotErr, want, wantErr)
				}
				for _, id := range []string{"never-written", "", "bad\x00id"} {
					want, wantErr := s.Load(ctx, id)
					got, gotErr := r.Load(ctx, id)
					sameRead(t, fmt.Sprintf("Load %q", id), got, gotErr, want, wantErr)
				}

				wantInfos, wantErr := s.Runs(ctx)
				gotInfos, gotErr := r.Runs(ctx)
				if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || len(gotInfos) != len(wantInfos) {
					t.Fatalf("Runs: %d, %v through the socket; %d, %v from the file", len(gotInfos), gotErr, len(wantInfos), wantErr)
				}
				for i := range wantInfos {
					if g, w := plainInfo(gotInfos[i]), plainInfo(wantInfos[i]); !reflect.DeepEqual(g, w) {
						t.Errorf("Runs[%d] through the socket\n  %+v\nfrom the file\n  %+v", i, g, w)
					}
				}
				for _, id := range []string{"r", "never-written"} {
					want, wantErr := s.Describe(ctx, id)
					got, gotErr := r.Describe(ctx, id)
					if !reflect.DeepEqual(plainInfo(got), plainInfo(want)) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) ||
						errors.Is(gotErr, seams.ErrNoRun) != errors.Is(wantErr, seams.ErrNoRun) {
						t.Errorf("Describe %q through the socket %+v, %v; from the file %+v, %v", id, got, gotErr, want, wantErr)
					}
				}
				if _, err := r.Append(ctx, "r", written[len(written)-1].ID, proptest.SoundStream("r")[1]); !errors.Is(err, ErrReadOnly) {
					t.Errorf("Append through the socket: %v, want ErrReadOnly", err)
				}
			})
		}
	}
}

var errStopScan = errors.New("stop the scan")

// ulidOf is the key of stream's seen-th event, zero for none.
func ulidOf(stream []events.Envelope, seen int) (id [16]byte) {
	if seen >= 1 && seen <= len(stream) {
		return stream[seen-1].ID
	}
	return id
}

// TestTheSocketIsTheWritersUsersOnly: a read-write Store listens beside
// its file on a socket of mode 0600, answers a process of its own user,
// refuses another's, and removes the socket when closed.
func TestTheSocketIsTheWritersUsersOnly(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sock, err := s.Serving()
	if err != nil || sock != path+".sock" {
		t.Fatalf("Serving: %q, %v; want %s.sock", sock, err, path)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("the socket is %v, want a socket of mode 0600", fi.Mode())
	}
	if err := sameUser(os.Getuid()); err != nil {
		t.Errorf("a peer of this user: %v", err)
	}
	if err := sameUser(os.Getuid() + 1); err == nil || !strings.Contains(err.Error(), fmt.Sprint(os.Getuid()+1)) {
		t.Errorf("a peer of another user: %v, want a refusal naming its user", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPeer(c); err != nil {
		t.Errorf("this process, as a peer: %v", err)
	}
	c.Close()
	s.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close the socket is still there: %v", err)
	}
	if _, err := Dial(path); !errors.Is(err, errNoSocket) {
		t.Errorf("Dial after Close: %v, want nothing answering", err)
	}
}

// TestWhenTheStoreServesNoReaders: NoServe, a read-only Store, a socket
// path longer than a socket address holds and a non-socket in the way
// each leave the Store open and unserved, and Serving says why; a stale
// socket (a writer that died) is replaced.
func TestWhenTheStoreServesNoReaders(t *testing.T) {
	dir := shortDir(t)
	long := filepath.Join(dir, strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	inTheWay := filepath.Join(dir, "way.db")
	if err := os.WriteFile(inTheWay+".sock", []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		o          Options
		why        string
	}{
		{"NoServe", filepath.Join(dir, "off.db"), Options{NoServe: true}, "Options.NoServe"},
		{"a long path", filepath.Join(long, "s.db"), Options{}, "longer than the 107"},
		{"a file in the way", inTheWay, Options{}, "is not a socket"},
	} {
		s, err := Open(c.path, c.o)
		if err != nil {
			t.Fatalf("%s: Open failed: %v", c.name, err)
		}
		_, err = s.Serving()
		if !errors.Is(err, ErrNotServed) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: Serving: %v, want ErrNotServed saying %q", c.name, err, c.why)
		}
		if fi, err := os.Lstat(c.path + ".sock"); err == nil && fi.Mode().Type() == os.ModeSocket {
			t.Errorf("%s: a socket was made", c.name)
		}
		s.Close()
	}
	if b, _ := os.ReadFile(inTheWay + ".sock"); string(b) != "mine" {
		t.Errorf("the file in the socket's way was changed: %q", b)
	}
	ro, err := Open(filepath.Join(dir, "off.db"), Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Serving(); !errors.Is(err, ErrNotServed) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("read-only: Serving: %v", err)
	}
	ro.Close()

	// A socket nobody listens on, as a killed writer leaves it.
	stale := filepath.Join(dir, "stale.db")
	l, err := net.Listen("unix", stale+".sock")
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := Dial(stale); !errors.Is(err, errNoSocket) {
		t.Fatalf("Dial of a stale socket: %v", err)
	}
	s, err := Open(stale, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Serving(); err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	r, err := Dial(stale)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// TestAReaderOfAnotherProtocolVersionIsRefused: a writer answering with
// another protocol version is refused by Dial with ErrProtocolVersion,
// saying both; a request of another version gets a refusal saying both.
func TestAReaderOfAnotherProtocolVersionIsRefused(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.db")
	l, err := net.Listen("unix", SocketPath(path))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(protocolHeader, "0")
		w.Write([]byte{0x80})
	})}
	go srv.Serve(l)
	defer srv.Close()
	_, err = Dial(path)
	if !errors.Is(err, ErrProtocolVersion) || !strings.Contains(err.Error(), `"0"`) || !strings.Contains(err.Error(), `"`+ProtocolVersion+`"`) {
		t.Errorf("Dial of a writer of protocol 0: %v", err)
	}

	s, err := Open(filepath.Join(shortDir(t), "w.db"), Options{NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/runs", nil)
	req.Header.Set(protocolHeader, "0")
	(&handler{store: s}).ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `reader protocol "0"`) || rec.Header().Get(protocolHeader) != ProtocolVersion {
		t.Errorf("a request of protocol 0: %d %q", rec.Code, rec.Body.String())
	}
}

// TestAReaderLetsAWriterIn: a Reader holds the file only while it reads,
// so a writer opens it after the Reader did; the Reader then reads through
// the writer's socket, sees what the writer appends, and once the writer
// closed its store reads the file again.
func TestAReaderLetsAWriterIn(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(shortDir(t), "s.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stream := proptest.SoundStream("r")
	proptest.AppendEach(t, s, "r", stream[:3])
	s.Close()

	r, err := OpenReader(path, Options{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := r.Load(ctx, "r"); err != nil || len(got) != 3 {
		t.Fatalf("Load: %d events, %v", len(got), err)
	}
	// In this process a second Open is refused at once rather than waiting
	// for the lock (claim): give the Reader's idle file time to close. A
	// writer in another process waits for it (the process tests).
	time.Sleep(3 * readerIdle)
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("a writer after the Reader: %v", err)
	}
	got, err := r.Load(ctx, "r")
	if err != nil || len(got) != 3 || r.Remote() == nil {
		t.Fatalf("Load while written: %d events, %v, through the socket: %t", len(got), err, r.Remote() != nil)
	}
	tail := got[2].ID
	for _, ev := range stream[3:] {
		envs, err := w.Append(ctx, "r", tail, ev)
		if err != nil {
			t.Fatal(err)
		}
		tail = envs[0].ID
		after, err := r.LoadAfter(ctx, "r", len(got), got[len(got)-1].ID)
		if err != nil || len(after) != 1 || after[0].ID != tail {
			t.Fatalf("LoadAfter %d: %d events, %v; want the one appended", len(got), len(after), err)
		}
		got = append(got, after...)
	}
	info, err := r.Describe(ctx, "r")
	if err != nil || info.Status != seams.StatusFinished {
		t.Errorf("Describe: %+v, %v", info, err)
	}
	w.Close()
	got, err = r.Load(ctx, "r")
	if err != nil || len(got) != len(stream) || r.Remote() != nil {
		t.Fatalf("Load after the writer closed: %d events, %v; through the socket: %t", len(got), err, r.Remote() != nil)
	}
	if _, err := r.Append(ctx, "r", tail, stream[1]); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Append: %v, want ErrReadOnly", err)
	}
}

// TestAReaderOfAWriterThatServesNoneSaysWhy: a file held by a writer that
// does not serve readers is refused with ErrLocked, saying that nothing
// answers on its socket.
func TestAReaderOfAWriterThatServesNoneSaysWhy(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.db")
	w, err := Open(path, Options{NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = OpenReader(path, Options{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "does not answer readers on its socket") {
		t.Errorf("OpenReader of a file held by a writer without a socket: %v", err)
	}
}
