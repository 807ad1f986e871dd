package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// TestDamagedRowsAreReported: rows changed behind the store's back are
// refused by Load with a DamageError naming the problem, together with
// the events that still decode.
func TestDamagedRowsAreReported(t *testing.T) {
	cases := []struct {
		name, sql, want string
		decoded         int // events Load still returns
	}{
		{"middle event deleted", `DELETE FROM {{schema}}.events WHERE run_id = 'd' AND seq = 2`,
			"event 2 is stored as number 3", 3},
		{"last event deleted", `DELETE FROM {{schema}}.events WHERE run_id = 'd' AND seq = 4`,
			"the tail is missing", 3},
		{"value byte flipped", `UPDATE {{schema}}.events SET value = set_byte(value, 20, get_byte(value, 20) # 1) WHERE run_id = 'd' AND seq = 3`,
			"checksum", 3},
		{"crc column changed", `UPDATE {{schema}}.events SET crc = crc # 1 WHERE run_id = 'd' AND seq = 3`,
			"crc column disagrees", 4},
		{"kind column changed", `UPDATE {{schema}}.events SET kind = 'intent' WHERE run_id = 'd' AND seq = 3`,
			"kind column says intent, the value is model_call_result", 4},
		{"keys out of order", `UPDATE {{schema}}.events SET id = (SELECT id FROM {{schema}}.events WHERE run_id = 'd' AND seq = 1) WHERE run_id = 'd' AND seq = 2`,
			"does not follow", 3},
		{"index row deleted", `DELETE FROM {{schema}}.runs WHERE run_id = 'd'`,
			"4 events but no index row", 4},
		{"event appended behind the index", `INSERT INTO {{schema}}.events SELECT run_id, 5, id, kind, value, crc FROM {{schema}}.events WHERE run_id = 'd' AND seq = 4`,
			"counts 4", 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t, pgstore.Options{})
			failure := "boom"
			if _, err := s.Append(ctx, "d", ulid.ULID{},
				events.RunStarted{RunID: "d", SchemaVersion: events.CurrentSchemaVersion},
				events.Intent{RunID: "d", IntentKind: events.IntentModelCall, ResultID: "m0", ReplayPolicy: events.ReplaySafe},
				events.ModelCallResult{RunID: "d", ResultID: "m0", Failure: &failure},
				events.Intent{RunID: "d", IntentKind: events.IntentModelCall, CallIndex: 1, ResultID: "m1", ReplayPolicy: events.ReplaySafe},
			); err != nil {
				t.Fatal(err)
			}
			exec(t, s.Schema(), c.sql)
			got, err := s.Load(ctx, "d")
			var de *events.DamageError
			if !errors.Is(err, pgstore.ErrCorrupt) || !errors.As(err, &de) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("load: %v, want damage saying %q", err, c.want)
			}
			if len(got) != c.decoded {
				t.Errorf("%d events decoded, want %d", len(got), c.decoded)
			}
		})
	}
}

// TestEveryDamageIsCorruption: whatever is changed behind the store's
// back — a value, a column, an event missing or added, the index row —
// every read reports it as damage (events.ErrCorruption and an
// *events.DamageError), as every store does.
func TestEveryDamageIsCorruption(t *testing.T) {
	sql := func(statement string) func(*testing.T, seams.RunStore, string, []events.Envelope) seams.RunStore {
		return func(t *testing.T, s seams.RunStore, run string, _ []events.Envelope) seams.RunStore {
			exec(t, s.(*pgstore.Store).Schema(), statement, run)
			return s
		}
	}
	proptest.CorruptionContract(t, func(t *testing.T) seams.RunStore { return open(t, pgstore.Options{}) }, []proptest.StoreDamage{
		{Name: "keys out of order", At: 1, Apply: sql(`UPDATE {{schema}}.events SET id = (SELECT id FROM {{schema}}.events WHERE run_id = $1 AND seq = 1) WHERE run_id = $1 AND seq = 2`)},
		{Name: "a kind column changed", At: 2, Apply: sql(`UPDATE {{schema}}.events SET kind = 'intent' WHERE run_id = $1 AND seq = 3`)},
		{Name: "a value byte flipped", At: 3, Apply: sql(`UPDATE {{schema}}.events SET value = set_byte(value, 20, get_byte(value, 20) # 1) WHERE run_id = $1 AND seq = 4`)},
		{Name: "a crc column changed", At: 5, Apply: sql(`UPDATE {{schema}}.events SET crc = crc # 1 WHERE run_id = $1 AND seq = 6`)},
		{Name: "an event in the middle deleted", At: 6, Apply: sql(`DELETE FROM {{schema}}.events WHERE run_id = $1 AND seq = 7`)},
		{Name: "the last event deleted", At: 14, Apply: sql(`DELETE FROM {{schema}}.events WHERE run_id = $1 AND seq = 15`)},
		{Name: "an event added behind the index", At: 15, Apply: sql(`INSERT INTO {{schema}}.events SELECT run_id, 16, id, kind, value, crc FROM {{schema}}.events WHERE run_id = $1 AND seq = 15`)},
		{Name: "the index row altered", At: 15, Apply: sql(`UPDATE {{schema}}.runs SET steps = steps + 1 WHERE run_id = $1`)},
		{Name: "the index row deleted", At: 15, Apply: sql(`DELETE FROM {{schema}}.runs WHERE run_id = $1`)},
	})
}
