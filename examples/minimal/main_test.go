package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
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
	args := os.Args
	defer func() { os.Args = args }()
	os.Args = []string{"minimal"} // not the test binary's flags
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

// TestAnArgumentIsRefused: minimal takes no arguments; given one (a flag
// such as --version, or a word) it says its usage and exits 2, running
// nothing, rather than run as if it had understood.
func TestAnArgumentIsRefused(t *testing.T) {
	if arg := os.Getenv("MINIMAL_TEST_ARG"); arg != "" {
		os.Args = []string{"minimal", arg}
		main()
		os.Exit(0)
	}
	for _, arg := range []string{"--version", "-bogus", "again"} {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestAnArgumentIsRefused$")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "MINIMAL_TEST_ARG="+arg, "OPENAI_BASE_URL=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := cmd.ProcessState.ExitCode()
		if code != 2 || !strings.HasPrefix(stderr.String(), "usage: minimal") || stdout.Len() > 0 {
			t.Errorf("minimal %s: exit %d (%v)\nstdout: %q\nstderr: %q", arg, code, err, stdout.String(), stderr.String())
		}
		if _, err := os.Stat(dir + "/minimal.db"); err == nil {
			t.Errorf("minimal %s ran: it made minimal.db", arg)
		}
	}
}
