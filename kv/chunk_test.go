package kv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

// bigRun appends to s a run of n model calls, each with a reply of size
// bytes that does not compress, and returns its id.
func bigRun(t *testing.T, s *Store, n, size int) string {
	t.Helper()
	const run = "big"
	evs := []events.Event{proptest.SoundStream(run)[0]}
	for i := range n {
		b := make([]byte, size*3/4)
		rand.Read(b)
		evs = append(evs,
			events.Intent{RunID: run, IntentKind: events.IntentModelCall, CallIndex: i, ResultID: fmt.Sprintf("m%d", i), ReplayPolicy: events.ReplaySafe},
			events.ModelCallResult{RunID: run, ResultID: fmt.Sprintf("m%d", i), Reply: &events.ModelReply{Content: base64.StdEncoding.EncodeToString(b)}})
	}
	proptest.AppendEach(t, s, run, evs)
	return run
}

// TestABigRunIsServedInBoundedChunks: a run many chunks long reads through
// the socket (Load, Scan, LoadAfter) as it reads from the file, and the
// writer allocates for each reply a bounded amount, not the run's size
// (it sends the stored values in chunks, undecoded).
func TestABigRunIsServedInBoundedChunks(t *testing.T) {
	ctx := context.Background()
	// Chunks of 256 KiB, so that a run of 3¼ MiB is thirteen of them
	// (and its reply, unchunked, some 17 MiB).
	defer func(was int) { maxChunkBytes = was }(maxChunkBytes)
	maxChunkBytes = 256 << 10
	for _, format := range formats {
		t.Run(format, func(t *testing.T) {
			path := filepath.Join(shortDir(t), "s.db")
			s, err := Open(path, Options{format: format, NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			run := bigRun(t, s, 13, 256<<10)
			r, err := Dial(path)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			want, wantErr := s.Load(ctx, run)
			if wantErr != nil {
				t.Fatal(wantErr)
			}
			got, gotErr := r.Load(ctx, run)
			sameRead(t, "Load", got, gotErr, want, wantErr)
			var scanned []events.Envelope
			err = r.Scan(ctx, run, func(env events.Envelope) error { scanned = append(scanned, env); return nil })
			sameRead(t, "Scan", scanned, err, want, nil)
			after, err := r.LoadAfter(ctx, run, 1, want[0].ID)
			wantAfter, wantAfterErr := s.LoadAfter(ctx, run, 1, want[0].ID)
			sameRead(t, "LoadAfter past a chunk", after, err, wantAfter, wantAfterErr)

			// The writer's side, reply by reply, with an event appended after
			// the first: the replies read the run as it stood at the first.
			h := newHandler(s)
			sr := events.StreamReader{RunID: run}
			q := url.Values{"run": {run}}
			bound := uint64(4 * maxChunkBytes) // the values copied, the reply encoded, and slack
			if raceOn {
				bound *= 2 // its own allocations beside
			}
			for chunks := 1; ; chunks++ {
				req := httptest.NewRequest(http.MethodGet, "/load?"+q.Encode(), nil)
				req.Header.Set(protocolHeader, ProtocolVersion)
				rec := httptest.NewRecorder()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				h.ServeHTTP(rec, req)
				runtime.ReadMemStats(&after)
				if n := after.TotalAlloc - before.TotalAlloc; n > bound {
					t.Fatalf("reply %d: the writer allocated %d MiB, more than %d MiB", chunks, n>>20, bound>>20)
				}
				var rep wireReply
				if err := msgpack.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rep.Err != nil {
					t.Fatalf("reply %d: %v, %v", chunks, err, rep.Err.err())
				}
				hand(&sr, rep.Reads)
				if chunks == 1 {
					if _, err := s.Append(ctx, run, want[len(want)-1].ID, proptest.SoundStream(run)[1]); err != nil {
						t.Fatal(err)
					}
				}
				if rep.Next == 0 {
					if chunks < 10 {
						t.Errorf("a run of 13 chunks came in %d replies", chunks)
					}
					break
				}
				q.Set("from", fmt.Sprint(rep.Next))
				q.Set("pin", fmt.Sprint(rep.Pin.Events))
				q.Set("last", ulid.ULID(rep.Pin.Last).String())
			}
			got, gotErr = loaded(run, &sr)
			sameRead(t, "Load in replies, the run appended to meanwhile", got, gotErr, want, nil)
		})
	}
}
