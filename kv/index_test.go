package kv

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/events"
)

// reflectedInfo is storedInfo without its EncodeMsgpack: what msgpack's
// reflection writes for the same fields and tags.
type reflectedInfo storedInfo

// The leader encodes index entries by hand; the bytes must be the ones the
// struct's reflection writes, which every reader decodes.
func TestTheEntryEncodingIsReflections(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		info := RunInfo{
			RunID:      rapid.String().Draw(t, "run"),
			Status:     rapid.SampledFrom([]Status{StatusRunning, StatusFinished, ""}).Draw(t, "status"),
			Steps:      rapid.IntRange(-1, 1<<40).Draw(t, "steps"),
			Events:     rapid.Int().Draw(t, "events"),
			StopReason: events.StopReason(rapid.String().Draw(t, "stop")),
			FirstEvent: time.Unix(rapid.Int64Range(-1<<40, 1<<40).Draw(t, "first"), rapid.Int64Range(0, 999999999).Draw(t, "firstns")),
			LastEvent:  time.UnixMilli(rapid.Int64Range(0, 1<<45).Draw(t, "last")).UTC(),
		}
		if rapid.Bool().Draw(t, "zero times") {
			info.FirstEvent, info.LastEvent = time.Time{}, time.Time{}
		}
		if rapid.Bool().Draw(t, "has last id") {
			info.LastID = ulid.ULID(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "last id"))
		}
		var crc *uint32
		if rapid.Bool().Draw(t, "has crc") {
			c := rapid.Uint32().Draw(t, "crc")
			crc = &c
		}
		want, err := msgpack.Marshal(&reflectedInfo{entry: storedEntry(info), CRC: crc})
		if err != nil {
			t.Fatal(err)
		}
		got, err := msgpack.Marshal(&storedInfo{entry: storedEntry(info), CRC: crc})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("hand-written entry\n%x\nreflection\n%x", got, want)
		}
	})
}

// TestTheEntryEncodingIsReflectionsAtItsBoundaries: msgpack writes an
// integer, a string and a timestamp in more or fewer bytes by its size;
// the hand-written entry changes form exactly where reflection does, on
// either side of every boundary.
func TestTheEntryEncodingIsReflectionsAtItsBoundaries(t *testing.T) {
	var ints []int64
	for _, edge := range []int64{0, 1 << 7, 1 << 8, 1 << 15, 1 << 16, 1 << 31, 1 << 32, 1 << 62} {
		ints = append(ints, edge-1, edge, -edge, -edge-1)
	}
	ints = append(ints, 31, 32, 33, -31, -32, -33, math.MaxInt64, math.MinInt64)
	var strs []string
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		strs = append(strs, strings.Repeat("r", n))
	}
	var times []time.Time
	for _, secs := range []int64{0, 1<<32 - 1, 1 << 32, 1<<34 - 1, 1 << 34, -1, -1 << 34, math.MaxInt64 / 2} {
		times = append(times, time.Unix(secs, 0), time.Unix(secs, 1), time.Unix(secs, 999999999))
	}
	times = append(times, time.Time{})
	var cases []storedInfo
	sum := uint32(0xdeadbeef)
	for _, n := range ints {
		cases = append(cases, storedInfo{entry: entry{Steps: int(n), Events: int(n)}, CRC: &sum})
	}
	for _, s := range strs {
		cases = append(cases, storedInfo{entry: entry{RunID: s, Status: Status(s), StopReason: events.StopReason(s)}})
	}
	for _, tm := range times {
		cases = append(cases, storedInfo{entry: entry{FirstEvent: tm, LastEvent: tm}, CRC: &sum})
	}
	for _, c := range cases {
		want, err := msgpack.Marshal((*reflectedInfo)(&c))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.appendMsgpack(nil); !bytes.Equal(got, want) {
			t.Errorf("steps %d, run id of %d bytes, first event %v: hand-written entry\n%x\nreflection\n%x",
				c.Steps, len(c.RunID), c.FirstEvent, got, want)
		}
	}
}

// failingWriter refuses every write.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// The hand-written entry encoding reports its writer's failure, as
// reflection's does, instead of a short entry.
func TestTheEntryEncodingReportsAFailedWrite(t *testing.T) {
	sum := uint32(7)
	err := msgpack.NewEncoder(failingWriter{}).Encode(&storedInfo{entry: entry{RunID: "r"}, CRC: &sum})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("encoding to a failing writer: %v", err)
	}
}

// TestTheLogsIndexFillsItsPagesWhole: in the log, index entries are filed
// by first key, so a new run's entry goes to the index's end, as a new
// event goes to the log's: the index's leaves are filled whole, not split
// half full (bbolt's default, for random inserts). Fewer leaves hold the
// entries of the runs being driven, and every commit rewrites the leaves
// its runs' entries sit in.
func TestTheLogsIndexFillsItsPagesWhole(t *testing.T) {
	s := queueStore(t, Options{NoSync: true})
	errs := make(chan error, 64)
	for i := range 2000 {
		appendAsync(s, fmt.Sprintf("run-%04d", i), errs)
		if i%64 == 63 {
			receive(t, errs, 64, "the appends did not commit")
		}
	}
	receive(t, errs, 2000%64, "the appends did not commit")
	err := s.db.View(func(tx *bolt.Tx) error {
		st := tx.Bucket(indexBucket).Stats()
		if fill := float64(st.LeafInuse) / float64(st.LeafAlloc); st.LeafPageN < 4 || fill < 0.9 {
			t.Errorf("2,000 runs' entries in %d leaves of %d bytes, %.0f%% in use; want them filled (≥ 90%%)",
				st.LeafPageN, st.LeafAlloc/max(st.LeafPageN, 1), 100*fill)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
