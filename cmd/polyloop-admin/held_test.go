package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/proptest"
)

// TestAWriteToAHeldFileSaysStopTheWriter: the commands that write a bbolt
// file need it to themselves; while a process writes it (here this one)
// they refuse, saying that the writer must stop first — reading it while
// written is polyloop-inspect's, through the writer's socket.
func TestAWriteToAHeldFileSaysStopTheWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	proptest.AppendEach(t, s, "u", proptest.SoundStream("u")[:3])
	for _, args := range [][]string{{"cancel", path, "u"}, {"delete", "--force", path, "u"}, {"compact", path}} {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		if code != exitProblem || !strings.Contains(errOut.String(), "stop the process that writes it first") {
			t.Errorf("%s: exit %d\n%s", strings.Join(args, " "), code, errOut.String())
		}
	}
}

// TestAStoreThatCannotBeOpenedIsOneSentence: a server that refuses, a
// missing file, a file that is no store and a file another writer holds
// are each said once, naming the store once, without package prefixes.
func TestAStoreThatCannotBeOpenedIsOneSentence(t *testing.T) {
	dir := t.TempDir()
	u := kvtest.UnopenableStores(t, dir)
	missing, text, held := u.Missing, u.NotAStore, u.Held
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"delete", "postgres://u:pw@127.0.0.1:1/db", "r"}, "polyloop-admin: cannot connect to postgres://u:xxxxx@127.0.0.1:1/db: connection refused\n"},
		{[]string{"gc", "--dry-run", "--finished-before", "1h", "host=127.0.0.1 port=1 user=u password=pw dbname=db"},
			"polyloop-admin: cannot connect to host=127.0.0.1 port=1 user=u password=xxxxx dbname=db: connection refused\n"},
		{[]string{"delete", missing, "r"}, "polyloop-admin: no store at " + missing + ": no such file or directory\n"},
		{[]string{"delete", text, "r"}, "polyloop-admin: " + text + " is not a PolyLoop store: not a bbolt file (no valid meta page)\n"},
		{[]string{"delete", held, "r"}, "polyloop-admin: " + held + " is held by this process (close that kv.Store first); " + heldAdvice + "\n"},
		{[]string{"compact", held}, "polyloop-admin: " + held + " is held by this process (close that kv.Store first); " + heldAdvice + "\n"},
	} {
		code, out, errOut := adminOut(c.args...)
		if code != exitProblem || out != "" || errOut != c.want {
			t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\n  want: %q", c.args, code, out, errOut, c.want)
		}
	}
}
