package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/internal/testbuild"
	"github.com/polyloop/polyloop/proptest"
)

// The process tests: a real agent process writing a bbolt store
// (testdata/slowagent: kv.Open read-write, one append at a time) and real
// polyloop-inspect processes reading it meanwhile, through the agent's
// reader socket.

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds polyloop-inspect and the slow agent once per test run.
func binaries(t *testing.T) (inspect, agent string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "plinspect")
		if buildErr != nil {
			return
		}
		buildErr = testbuild.Build(binDir, nil, ".", "./testdata/slowagent")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "polyloop-inspect"), filepath.Join(binDir, "slowagent")
}

// shortTemp is a temporary directory short enough for a socket beside a
// store in it.
func shortTemp(t *testing.T) string {
	dir, err := os.MkdirTemp("", "pli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// proc is a started process whose standard output is read line by line.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr strings.Builder
	done   chan error
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), lines: make(chan string, 1000), done: make(chan error, 1)}
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	return p
}

// waitFor reads p's lines until one matches, failing t after a while.
func (p *proc) waitFor(t *testing.T, match func(string) bool) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s ended before the line wanted; stderr: %s", p.cmd.Path, p.stderr.String())
			}
			if match(line) {
				return line
			}
		case <-timeout:
			t.Fatalf("%s: no line wanted in 30s; stderr: %s", p.cmd.Path, p.stderr.String())
		}
	}
}

// rest is every line p prints until it ends, and its exit code.
func (p *proc) rest(t *testing.T) ([]string, int) {
	t.Helper()
	var lines []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.done <- <-p.done // keep it for the cleanup
				return lines, p.cmd.ProcessState.ExitCode()
			}
			lines = append(lines, line)
		case <-timeout:
			t.Fatalf("%s did not end in 60s; stderr: %s", p.cmd.Path, p.stderr.String())
		}
	}
}

func appended(n int) func(string) bool {
	return func(line string) bool { return line == fmt.Sprintf("appended %d", n) }
}

// inspect runs polyloop-inspect to its end.
func inspectRun(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// eventLines counts the events a plain `events` printed (one per line,
// each led by its ULID).
var eventLine = regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26} `)

func countEvents(lines []string) int {
	n := 0
	for _, l := range lines {
		if eventLine.MatchString(l) {
			n++
		}
	}
	return n
}

// TestInspectorReadsWhileAnAgentWrites: while an agent process writes its
// store, runs, verify and events read it (the events durable so far) and
// events --follow prints the rest as they come, to the finish; the agent
// is never kept from writing. The agent holds after 3 events until the
// readers have read, so the test does not depend on how fast they are.
func TestInspectorReadsWhileAnAgentWrites(t *testing.T) {
	inspect, agentBin := binaries(t)
	dir := shortTemp(t)
	path, gate := filepath.Join(dir, "runs.db"), filepath.Join(dir, "gate")
	total := len(proptest.SoundStream("live"))
	agent := start(t, agentBin, "-store", path, "-run", "live", "-delay", "20ms", "-hold", "3", "-gate", gate)
	agent.waitFor(t, appended(3))

	out, errOut, code := inspectRun(t, inspect, "runs", path)
	if code != 0 || !strings.Contains(out, "live") || !strings.Contains(out, "running") {
		t.Fatalf("runs while the agent writes: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = inspectRun(t, inspect, "verify", path, "live")
	if code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("verify while the agent writes: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = inspectRun(t, inspect, "events", path, "live")
	if n := countEvents(strings.Split(out, "\n")); code != 0 || n != 3 {
		t.Fatalf("events while the agent writes: exit %d, %d events (want the 3 durable)\n%s%s", code, n, out, errOut)
	}

	follow := start(t, inspect, "events", "--follow", path, "live")
	first := follow.waitFor(t, eventLine.MatchString)
	if err := os.WriteFile(gate, nil, 0o600); err != nil { // the agent goes on
		t.Fatal(err)
	}
	lines, code := follow.rest(t)
	lines = append([]string{first}, lines...)
	if n := countEvents(lines); code != 0 || n != total || !strings.Contains(lines[len(lines)-1], "run_finished") {
		t.Fatalf("events --follow: exit %d, %d events of %d, last %q; stderr: %s", code, n, total, lines[len(lines)-1], follow.stderr.String())
	}
	if _, code := agent.rest(t); code != 0 {
		t.Fatalf("the agent failed: %s", agent.stderr.String())
	}
}

// TestServeStartedBeforeTheAgent: polyloop-inspect serve, started first,
// does not keep an agent from opening the store; the viewer then shows
// the agent's run live, and finished once it is.
func TestServeStartedBeforeTheAgent(t *testing.T) {
	inspect, agentBin := binaries(t)
	path := filepath.Join(shortTemp(t), "runs.db")
	first := start(t, agentBin, "-store", path, "-run", "earlier", "-delay", "0")
	if _, code := first.rest(t); code != 0 {
		t.Fatalf("the first agent: %s", first.stderr.String())
	}
	serve := start(t, inspect, "serve", "--addr", "127.0.0.1:0", path)
	line := serve.waitFor(t, func(l string) bool { return strings.HasPrefix(l, "serving ") })
	addr := regexp.MustCompile(`http://[^/]+/`).FindString(line)
	if addr == "" {
		t.Fatalf("no address in %q", line)
	}
	get := func(url string) string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
		}
		return string(b)
	}
	get(addr) // the viewer has the file open, or had it a moment ago

	agent := start(t, agentBin, "-store", path, "-run", "live", "-delay", "100ms")
	agent.waitFor(t, func(l string) bool { return l == "opened" })
	agent.waitFor(t, appended(4))
	if page := get(addr + "run?id=live"); !strings.Contains(page, "live") || !strings.Contains(page, "running") {
		t.Fatalf("the run's page while the agent writes:\n%s", page)
	}
	if runs := get(addr + "api/runs"); !strings.Contains(runs, `"live"`) || !strings.Contains(runs, `"running"`) {
		t.Fatalf("api/runs while the agent writes:\n%s", runs)
	}
	if _, code := agent.rest(t); code != 0 {
		t.Fatalf("the agent failed: %s", agent.stderr.String())
	}
	if page := get(addr + "run?id=live"); !strings.Contains(page, "finished") {
		t.Fatalf("the run's page once the agent finished:\n%s", page)
	}
}

// TestAWriterKilledMidFollowIsNamed: when the agent is killed while
// events --follow reads through its socket, the follower goes on
// following — from the file, which is free now, saying the run is no
// longer driven — and prints nothing twice; a fresh read opens the file
// directly and finds every event made durable.
func TestAWriterKilledMidFollowIsNamed(t *testing.T) {
	inspect, agentBin := binaries(t)
	path := filepath.Join(shortTemp(t), "runs.db")
	agent := start(t, agentBin, "-store", path, "-run", "live", "-delay", "20ms", "-hold", "6")
	agent.waitFor(t, appended(6))
	follow := start(t, inspect, "events", "--follow", path, "live")
	for n := 0; n < 6; n++ {
		follow.waitFor(t, eventLine.MatchString)
	}
	time.Sleep(300 * time.Millisecond) // a poll or so through the socket
	if err := agent.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // polls of the file, free now
	if err := follow.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	lines, code := follow.rest(t)
	stderr := follow.stderr.String()
	if code != 0 || !strings.Contains(stderr, "still following") || countEvents(lines) != 0 {
		t.Fatalf("events --follow when the writer was killed: exit %d, %d more events; stderr: %s", code, countEvents(lines), stderr)
	}
	out, errOut, code := inspectRun(t, inspect, "events", path, "live")
	if n := countEvents(strings.Split(out, "\n")); code != 0 || n != 6 {
		t.Fatalf("events after the writer died: exit %d, %d events, want the 6 durable\n%s%s", code, n, out, errOut)
	}
	out, _, _ = inspectRun(t, inspect, "runs", path)
	if !strings.Contains(out, "in_doubt") { // its tail an intent nobody finished: nobody holds it now
		t.Errorf("runs after the writer died:\n%s", out)
	}
}
