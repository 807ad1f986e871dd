package events_test

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// FuzzUnmarshal: decoding arbitrary bytes never panics, and whatever
// decodes re-encodes to a value that decodes to the same event.
// Seeds: the golden encodings of every record (testdata/wire) and the
// committed corpus under testdata/fuzz/FuzzUnmarshal.
func FuzzUnmarshal(f *testing.F) {
	files, _ := filepath.Glob("testdata/wire/*.msgpack")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	id := ulid.MustParse("01JDQ6Z8Y0000000000000000Z")
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := events.Unmarshal("run-1", id, b)
		if err != nil {
			return
		}
		again, err := events.Marshal(env.Event)
		if err != nil {
			t.Fatalf("decoded event does not re-encode: %v", err)
		}
		if err := events.Seal(again, "run-1", id); err != nil {
			t.Fatal(err)
		}
		env2, err := events.Unmarshal("run-1", id, again)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !reflect.DeepEqual(env.Event, env2.Event) {
			t.Fatalf("round trip changed the event:\n%#v\n%#v", env.Event, env2.Event)
		}
	})
}
