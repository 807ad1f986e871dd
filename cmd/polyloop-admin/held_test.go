package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
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
