package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
)

// TestTheReadmeShowsThisProgram: the README's minimal consumer is this
// file, byte for byte, so the README's code compiles and runs.
func TestTheReadmeShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- examples/minimal/main.go -->\n```go\n"
	_, after, ok := bytes.Cut(readme, []byte(marker))
	if !ok {
		t.Fatalf("README.md has no %q", marker)
	}
	shown, _, ok := bytes.Cut(after, []byte("```\n"))
	if !ok || !bytes.Equal(shown, src) {
		t.Fatalf("README.md's minimal consumer differs from examples/minimal/main.go; copy the file into the README")
	}
}

// TestTheMinimalAgentFinishesAndResumes: run offline, it finishes with the
// answer; run again, it returns the stored result without a second run.
func TestTheMinimalAgentFinishesAndResumes(t *testing.T) {
	t.Setenv("OPENAI_BASE_URL", "")
	t.Chdir(t.TempDir())
	main()
	main()
	s, err := kv.Open("minimal.db", kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, _ := s.Runs(context.Background())
	stream, err := s.Load(context.Background(), "minimal-1")
	if err != nil || len(runs) != 1 {
		t.Fatalf("%d runs: %v", len(runs), err)
	}
	r, ok := projections.Fold(stream).Result()
	if !ok || r.StopReason != events.StopAgentFinished || r.FinalAnswer == nil || !strings.Contains(*r.FinalAnswer, "42") {
		t.Fatalf("result %+v", r)
	}
}
