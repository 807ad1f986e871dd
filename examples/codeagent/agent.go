package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// sandbox runs code blocks with an interpreter in one working directory per
// run (state persists between steps, like a container session), with a
// time limit per block. Output beyond MaxChars is cut and counted. The
// environment reports completion when the output holds the Done marker.
type sandbox struct {
	Interpreter string
	Timeout     time.Duration
	MaxChars    int
	Done        string
	Root        string // working directories are made under it
	// SeedFrom, when set, is a directory copied into a run's working
	// directory when the sandbox makes it: a fork's, from its source's.
	SeedFrom string
}

// dir is runID's working directory.
func (s *sandbox) dir(runID string) string {
	return filepath.Join(s.Root, "run-"+strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == '.' {
			return '_'
		}
		return r
	}, runID))
}

// workdir returns runID's working directory, made (and seeded from
// SeedFrom, if that exists) when it does not exist.
func (s *sandbox) workdir(runID string) (string, error) {
	dir := s.dir(runID)
	if _, err := os.Stat(dir); err == nil || !errors.Is(err, os.ErrNotExist) {
		return dir, err
	}
	if s.SeedFrom != "" {
		if _, err := os.Stat(s.SeedFrom); err == nil {
			if err := os.CopyFS(dir, os.DirFS(s.SeedFrom)); err != nil {
				return dir, fmt.Errorf("sandbox: seeding %s from %s: %w", dir, s.SeedFrom, err)
			}
			return dir, nil
		}
	}
	return dir, os.MkdirAll(dir, 0o700)
}

func (s *sandbox) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	dir, err := s.workdir(call.RunID)
	if err != nil {
		return events.ActionOutcome{}, err
	}
	script := filepath.Join(dir, fmt.Sprintf(".step-%d", call.StepIdx))
	if err := os.WriteFile(script, []byte(call.Action.Text), 0o600); err != nil {
		return events.ActionOutcome{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, s.Interpreter, script)
	cmd.Dir = dir
	// On timeout kill the whole process group: a block's children (a sleep,
	// a server) must not outlive it or hold its output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ctx.Err() != nil {
		return events.ActionOutcome{}, ctx.Err()
	}
	text := out.String()
	var exitErr *exec.ExitError
	switch {
	case runCtx.Err() != nil:
		text += fmt.Sprintf("\n[timed out after %s]", s.Timeout)
	case errors.As(err, &exitErr):
		text += "\n[exit status " + strconv.Itoa(exitErr.ExitCode()) + "]"
	case err != nil:
		return events.ActionOutcome{}, fmt.Errorf("sandbox: %s: %w", s.Interpreter, err) // the environment is broken
	}
	done := s.Done != "" && strings.Contains(text, s.Done)
	truncated := 0
	if n := utf8.RuneCountInString(text); n > s.MaxChars {
		truncated = n - s.MaxChars
		text = string([]rune(text)[:s.MaxChars])
	}
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: text,
		ObservationTruncatedChars: truncated, EnvReportedCompletion: done}, nil
}

func (s *sandbox) Parameters() map[string]string {
	return map[string]string{"interpreter": s.Interpreter, "timeout": s.Timeout.String(),
		"max_chars": strconv.Itoa(s.MaxChars), "done_marker": s.Done}
}
