package kv

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// Status is a run's state as the index knows it.
type Status string

const (
	// StatusRunning: the stream has no RunFinished (the run is in progress,
	// or crashed and may be resumed).
	StatusRunning Status = "running"
	// StatusFinished: the stream ends with RunFinished.
	StatusFinished Status = "finished"
	// StatusDamaged: the index entry itself is damaged (it does not decode
	// or fails its checksum); only RunID is known, and loading the run
	// reports the damage.
	StatusDamaged Status = "damaged"
)

// RunInfo is a run's index entry, maintained in the transaction of every
// append so listings need not scan streams. Events and LastID anchor the
// stream: Load refuses a stream with another length or another last key,
// so an event missing in the middle or at the tail is noticed.
type RunInfo struct {
	RunID      string            `msgpack:"run_id"`
	Status     Status            `msgpack:"status"`
	Steps      int               `msgpack:"steps"`
	Events     int               `msgpack:"events"`
	StopReason events.StopReason `msgpack:"stop_reason"`
	FirstEvent time.Time         `msgpack:"first_event"`
	LastEvent  time.Time         `msgpack:"last_event"`
	// LastID is the key of the stream's last event (zero in entries
	// written before the store kept it).
	LastID ulid.ULID `msgpack:"last_id"`
}

// storedInfo is an index entry as stored: the RunInfo and a CRC-32C over its
// fields and the run id it is filed under (absent in entries written before
// the store kept one).
type storedInfo struct {
	RunInfo `msgpack:",inline"`
	CRC     *uint32 `msgpack:"crc"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sum is the entry's checksum: every field, in a fixed order, with the key
// it is filed under.
func (r *RunInfo) sum(key []byte) uint32 {
	b := binary.AppendUvarint(nil, uint64(len(key)))
	b = append(b, key...)
	for _, s := range []string{r.RunID, string(r.Status), string(r.StopReason)} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, n := range []int64{int64(r.Steps), int64(r.Events), r.FirstEvent.UnixNano(), r.LastEvent.UnixNano()} {
		b = binary.AppendVarint(b, n)
	}
	b = append(b, r.LastID[:]...)
	return crc32.Checksum(b, castagnoli)
}

func (r *RunInfo) observe(env events.Envelope) {
	if r.Events == 0 {
		r.FirstEvent = env.Time()
	}
	r.Events++
	r.LastEvent = env.Time()
	r.LastID = env.ID
	switch ev := env.Event.(type) {
	case events.StepCompleted:
		r.Steps++
	case events.RunFinished:
		r.Status = StatusFinished
		r.StopReason = ev.Result.StopReason
	}
}

// readInfo reads runID's index entry: ok false when there is none, an
// ErrCorrupt error when it does not decode, fails its checksum or is filed
// under another run id.
func readInfo(index *bolt.Bucket, key []byte) (info RunInfo, ok bool, err error) {
	v := index.Get(key)
	if v == nil {
		return RunInfo{}, false, nil
	}
	info, err = decodeInfo(key, v)
	return info, true, err
}

// maxInfoSize bounds an index entry: a few hundred bytes in practice.
const maxInfoSize = 64 << 10

func decodeInfo(key, v []byte) (RunInfo, error) {
	if len(v) > maxInfoSize {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is %d bytes, more than an entry can be", ErrCorrupt, key, len(v))
	}
	if err := events.WellFormed(v); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is not a msgpack value: %v", ErrCorrupt, key, err)
	}
	var st storedInfo
	if err := msgpack.Unmarshal(v, &st); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q does not decode: %v", ErrCorrupt, key, err)
	}
	if st.CRC != nil && *st.CRC != st.sum(key) {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q fails its checksum", ErrCorrupt, key)
	}
	if st.RunID != string(key) {
		return RunInfo{}, fmt.Errorf("%w: index entry filed under run %q names run %q", ErrCorrupt, key, st.RunID)
	}
	return st.RunInfo, nil
}

// writeInfo stores info, with its checksum, under its run id.
func writeInfo(index *bolt.Bucket, info RunInfo) error {
	key := []byte(info.RunID)
	sum := info.sum(key)
	v, err := msgpack.Marshal(&storedInfo{RunInfo: info, CRC: &sum})
	if err != nil {
		return err
	}
	return index.Put(key, v)
}
