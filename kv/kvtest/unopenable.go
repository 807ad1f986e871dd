package kvtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
)

// Unopenable is one store path of each kind a command meets and cannot
// open: a file in a directory that does not exist, a file that is no store
// (a password file), and a store another writer holds without answering
// readers (kv.Options.NoServe).
type Unopenable struct{ Missing, NotAStore, Held string }

// UnopenableStores makes them in dir; the writer holds Held until the test
// ends.
func UnopenableStores(t testing.TB, dir string) Unopenable {
	t.Helper()
	u := Unopenable{Missing: filepath.Join(dir, "none", "x.db"), NotAStore: filepath.Join(dir, "passwd"), Held: filepath.Join(dir, "held.db")}
	if err := os.WriteFile(u.NotAStore, []byte(strings.Repeat("root:x:0:0:root:/root:/bin/bash\n", 200)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := kv.Open(u.Held, kv.Options{NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return u
}
