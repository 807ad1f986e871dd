package kv

import (
	"fmt"
	"hash/crc32"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Status and RunInfo are the seams' types, under their kv names.
type (
	Status  = seams.RunStatus
	RunInfo = seams.RunInfo
)

// Index statuses (see seams.RunStatus).
const (
	StatusRunning  = seams.StatusRunning
	StatusFinished = seams.StatusFinished
	StatusCorrupt  = seams.StatusCorrupt
)

// entry is a RunInfo under the names kv stores its fields by: RunInfo's
// fields, in its order, so each converts to the other (a field added to
// RunInfo does not compile here until it has a stored name).
type entry struct {
	RunID      string            `msgpack:"run_id"`
	Status     Status            `msgpack:"status"`
	Steps      int               `msgpack:"steps"`
	Events     int               `msgpack:"events"`
	StopReason events.StopReason `msgpack:"stop_reason"`
	FirstEvent time.Time         `msgpack:"first_event"`
	LastEvent  time.Time         `msgpack:"last_event"`
	LastID     ulid.ULID         `msgpack:"last_id"` // zero in entries written before the store kept it
}

// storedInfo is an index entry as stored: the RunInfo and its CRC-32C
// (seams.RunInfo.Checksum: its fields and the key it is filed under;
// absent in entries written before the store kept one).
type storedInfo struct {
	entry `msgpack:",inline"`
	CRC   *uint32 `msgpack:"crc"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readInfo reads runID's index entry, filed under key (the layout's
// entryKey; nil: none on record): ok false when there is none, an
// ErrCorrupt error when it does not decode, fails its checksum or names
// another run.
func readInfo(index *bolt.Bucket, key []byte, runID string) (info RunInfo, ok bool, err error) {
	if key == nil {
		return RunInfo{}, false, nil
	}
	v := index.Get(key)
	if v == nil {
		return RunInfo{}, false, nil
	}
	info, err = decodeInfo(key, v, runID)
	return info, true, err
}

// maxInfoSize bounds an index entry: a few hundred bytes in practice.
const maxInfoSize = 64 << 10

// decodeInfo decodes the entry v filed under key, which must name runID.
func decodeInfo(key, v []byte, runID string) (RunInfo, error) {
	if len(v) > maxInfoSize {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is %d bytes, more than an entry can be", ErrCorrupt, runID, len(v))
	}
	if err := events.WellFormed(v); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is not a msgpack value: %v", ErrCorrupt, runID, err)
	}
	var st storedInfo
	if err := msgpack.Unmarshal(v, &st); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q does not decode: %v", ErrCorrupt, runID, err)
	}
	info := RunInfo(st.entry)
	if st.CRC != nil && *st.CRC != info.Checksum(key) {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q fails its checksum", ErrCorrupt, runID)
	}
	if st.RunID != runID {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q names run %q", ErrCorrupt, runID, st.RunID)
	}
	return info, nil
}

// writeInfo stores info, with its checksum, under key (the layout's
// entryKey), and returns the bytes stored.
func writeInfo(index *bolt.Bucket, key []byte, info RunInfo) ([]byte, error) {
	v, err := encodeInfo(key, info)
	if err != nil {
		return nil, err
	}
	return v, index.Put(key, v)
}

// encodeInfo is info as stored under key, with its checksum.
func encodeInfo(key []byte, info RunInfo) ([]byte, error) {
	sum := info.Checksum(key)
	return msgpack.Marshal(&storedInfo{entry: entry(info), CRC: &sum})
}

// EncodeMsgpack writes the entry field by field: the bytes msgpack's
// reflection writes for the struct (TestTheEntryEncodingIsReflections
// holds the two together), without the reflection. The committing leader
// encodes an entry with every append, inside the group's transaction.
func (st *storedInfo) EncodeMsgpack(e *msgpack.Encoder) error {
	r := &st.entry
	w := entryWriter{e: e}
	w.put(e.EncodeMapLen(9))
	w.str("run_id", r.RunID)
	w.str("status", string(r.Status))
	w.int("steps", r.Steps)
	w.int("events", r.Events)
	w.str("stop_reason", string(r.StopReason))
	w.key("first_event")
	w.put(e.EncodeTime(r.FirstEvent))
	w.key("last_event")
	w.put(e.EncodeTime(r.LastEvent))
	w.key("last_id")
	w.put(e.EncodeBytes(r.LastID[:]))
	w.key("crc")
	if st.CRC == nil {
		w.put(e.EncodeNil())
	} else {
		w.put(e.EncodeUint32(*st.CRC))
	}
	return w.err
}

// entryWriter keeps the first error of a run of encoder calls.
type entryWriter struct {
	e   *msgpack.Encoder
	err error
}

func (w *entryWriter) put(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *entryWriter) key(k string) { w.put(w.e.EncodeString(k)) }

func (w *entryWriter) str(k, v string) {
	w.key(k)
	w.put(w.e.EncodeString(v))
}

func (w *entryWriter) int(k string, v int) {
	w.key(k)
	w.put(w.e.EncodeInt(int64(v)))
}
