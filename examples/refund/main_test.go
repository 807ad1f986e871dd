package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/testbuild"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
)

// The binaries the tests run — this program, polyloop-admin and
// polyloop-inspect — built once into a directory of their own.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds the three programs (once) and returns their directory.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "refund-bin-"); buildErr != nil {
			return
		}
		buildErr = testbuild.Build(binDir, nil,
			"github.com/polyloop/polyloop/examples/refund", "github.com/polyloop/polyloop/cmd/polyloop-admin",
			"github.com/polyloop/polyloop/cmd/polyloop-inspect")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// desk is a person at a terminal in a directory of their own: they run
// the program there (its store and ledger are the default files in it),
// and paste the commands it prints.
type desk struct {
	t   *testing.T
	dir string
	env []string
}

func newDesk(t *testing.T) *desk {
	bin := binaries(t)
	return &desk{t: t, dir: t.TempDir(), env: append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))}
}

// run runs a command line in a shell at the desk, as a person who pastes
// it, and returns its output (stdout and stderr) and exit status.
func (d *desk) run(line string) (string, int) {
	d.t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir, cmd.Env = d.dir, d.env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		d.t.Fatalf("%s: %v", line, err)
	}
	return string(out), 0
}

// must runs line and fails the test unless it exits with code.
func (d *desk) must(code int, line string) string {
	d.t.Helper()
	out, got := d.run(line)
	if got != code {
		d.t.Fatalf("$ %s\n%s[exit %d, want %d]", line, out, got, code)
	}
	return out
}

// ledger is what the payment provider refunded.
func (d *desk) ledger() []refund {
	d.t.Helper()
	f, err := os.Open(filepath.Join(d.dir, "refund-ledger.jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	var out []refund
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r refund
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			d.t.Fatalf("ledger line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// command is the polyloop-admin command the program printed for says
// ("approve", "reject", "it ran", "it did not run"), as it is runnable:
// without the optional flags in brackets at its end.
func command(t *testing.T, printed, says string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(says) + `: +(polyloop-admin .*)$`).FindStringSubmatch(printed)
	if m == nil {
		t.Fatalf("the program printed no %q command:\n%s", says, printed)
	}
	line, _, _ := strings.Cut(m[1], " [")
	return line
}

// lookupLine is what the program prints as the run's first step, the
// order's lookup, becomes durable (package progress); a run resumed after
// it prints it no more.
const lookupLine = `refund-1 step 0: tool lookup_order {"order":"A-1042"} -> executed, - tokens` + "\n"

// refundSteps is what the program prints as the refund's step, with its
// status, and the answer's step become durable.
func refundSteps(status string) string {
	return `refund-1 step 1: tool refund {"amount":250,"order":"A-1042"} -> ` + status + ", - tokens\n" +
		"refund-1 step 2: final answer -> -, - tokens\n"
}

// waitsForApproval runs the program at d the first time: the refund of
// 250 waits for approval, nothing is refunded, and the output names the
// call and the commands that decide it. It returns the output and the
// call's id.
func waitsForApproval(t *testing.T, d *desk) (string, string) {
	t.Helper()
	out := d.must(0, "refund")
	// The lookup's line as its step became durable, then the wait.
	m := regexp.MustCompile(`^` + regexp.QuoteMeta(lookupLine) + `refund-1 waits for a person's approval: refund \{"amount":250,"order":"A-1042"\} \(step 1, call ([0-9A-Z]{26})\), since \d{4}-`).
		FindStringSubmatch(out)
	if m == nil || !strings.HasSuffix(out, "Then run this program again: the run goes on.\n") {
		t.Fatalf("the first run:\n%s", out)
	}
	store := filepath.Join(d.dir, "refund.db")
	if want := "polyloop-admin approve " + store + " refund-1 " + m[1]; command(t, out, "approve") != want {
		t.Fatalf("the approve command is %q, want %q", command(t, out, "approve"), want)
	}
	if n := len(d.ledger()); n != 0 {
		t.Fatalf("%d refunds made before anyone approved", n)
	}
	return out, m[1]
}

// TestAnApprovedRefundIsMadeOnce: the run stops, the refund awaiting
// approval; running the program again changes nothing until a person
// decides; polyloop-inspect lists the run awaiting approval with its
// call; the person pastes the approve command the program printed; the
// program, run again, refunds once and answers; run once more, it
// answers the same without refunding again.
func TestAnApprovedRefundIsMadeOnce(t *testing.T) {
	d := newDesk(t)
	first, call := waitsForApproval(t, d)
	if again := d.must(0, "refund"); again != strings.TrimPrefix(first, lookupLine) {
		t.Fatalf("run again before a decision:\n%s\nwant what the first said:\n%s", again, first)
	}
	listed := d.must(0, "polyloop-inspect runs --status awaiting_approval refund.db")
	if !regexp.MustCompile(`(?m)^refund-1 +awaiting_approval +1 .* refund call ` + call + `$`).MatchString(listed) {
		t.Fatalf("runs --status awaiting_approval:\n%s", listed)
	}
	var pending struct {
		Status  string `json:"status"`
		Pending struct {
			Call, Tool, Arguments string
		} `json:"pending"`
	}
	if err := json.Unmarshal([]byte(d.must(0, "polyloop-inspect runs --json --status awaiting_approval refund.db")), &pending); err != nil ||
		pending.Pending.Call != call || pending.Pending.Tool != "refund" || pending.Pending.Arguments != `{"amount":250,"order":"A-1042"}` {
		t.Fatalf("runs --json: %+v, %v", pending, err)
	}
	if out := d.must(0, command(t, first, "approve")+" --by ana --note 'customer sent photos'"); !strings.HasPrefix(out, "refund-1: call "+call+" (refund) approved by ana\n") {
		t.Fatalf("approve:\n%s", out)
	}
	want := "refund-1: agent_finished after 3 steps: Dear Dana, I refunded 250.00 EUR for order A-1042 (provider reference " + call + ").\n"
	for i := range 2 {
		w := want // the run finished: its answer alone
		if i == 0 {
			w = refundSteps("executed") + want // the steps as they become durable, then the answer
		}
		if out := d.must(0, "refund"); out != w {
			t.Fatalf("after the approval:\n%s\nwant\n%s", out, w)
		}
		if got := d.ledger(); len(got) != 1 || got[0] != (refund{Call: call, Run: "refund-1", Order: "A-1042", Amount: 250}) {
			t.Fatalf("the ledger: %+v, want the one refund of 250 by call %s", got, call)
		}
	}
	if listed := d.must(0, "polyloop-inspect runs --status awaiting_approval refund.db"); strings.Contains(listed, "refund-1") {
		t.Fatalf("the run is listed awaiting approval once approved:\n%s", listed)
	}
}

// TestARejectedRefundIsNeverMade: the person rejects the refund with a
// note (approving it after is refused); the program, run again, makes no
// refund, and the model, told "rejected by reviewer: <note>", answers
// with it.
func TestARejectedRefundIsNeverMade(t *testing.T) {
	d := newDesk(t)
	first, call := waitsForApproval(t, d)
	const note = "the parcel was insured: claim it from the carrier"
	if out := d.must(0, command(t, first, "reject")+" --by bo --note '"+note+"'"); !strings.HasPrefix(out, "refund-1: call "+call+" (refund) rejected by bo\n") {
		t.Fatalf("reject:\n%s", out)
	}
	if out := d.must(1, command(t, first, "approve")); !strings.Contains(out, "is decided already: rejected by \"bo\"") {
		t.Fatalf("approve after the rejection:\n%s", out)
	}
	want := refundSteps("not_executed") + "refund-1: agent_finished after 3 steps: Dear Dana, I could not refund order A-1042 (rejected by reviewer: " + note + ").\n"
	if out := d.must(0, "refund"); out != want {
		t.Fatalf("after the rejection:\n%s\nwant\n%s", out, want)
	}
	if got := d.ledger(); len(got) != 0 {
		t.Fatalf("a rejected refund was made: %+v", got)
	}
	if out := d.must(1, command(t, first, "approve")); !strings.Contains(out, `is decided already: rejected by "bo" (the step has completed since)`) {
		t.Fatalf("approve once the run went on:\n%s", out)
	}
}

// TestAnEditedRefundIsCheckedAndMade: arguments the refund tool's schema
// refuses are refused, nothing recorded; the person approves a smaller
// refund, and that one is made, once.
func TestAnEditedRefundIsCheckedAndMade(t *testing.T) {
	d := newDesk(t)
	first, call := waitsForApproval(t, d)
	approve := command(t, first, "approve")
	if out := d.must(1, approve+` --arguments '{"order":"A-1042","amount":5000}'`); !strings.Contains(out, "refused, nothing recorded: edited arguments") ||
		!strings.Contains(out, "maximum: got 5,000, want 1,000") {
		t.Fatalf("approve of 5000:\n%s", out)
	}
	d.must(0, approve+` --arguments '{"order":"A-1042","amount":120}'`)
	if out := d.must(0, "refund"); !strings.Contains(out, "I refunded 120.00 EUR for order A-1042") {
		t.Fatalf("after the approval of 120:\n%s", out)
	}
	if got := d.ledger(); len(got) != 1 || got[0].Amount != 120 || got[0].Call != call {
		t.Fatalf("the ledger: %+v", got)
	}
}

// settle runs the program at d until the run finishes, a person settling
// a refund a crash left in doubt as the ledger shows it, with the command
// the program printed; it returns the program's last output. The ledger
// never holds two refunds.
func settle(t *testing.T, d *desk, call string) string {
	t.Helper()
	for range 3 {
		out := d.must(0, "refund")
		if len(d.ledger()) > 1 {
			t.Fatalf("refunded twice: %+v", d.ledger())
		}
		if !strings.Contains(out, "waits for an operator: a crash left refund") {
			return out
		}
		if !strings.Contains(out, "Look for call "+call+" in the provider's ledger (refund-ledger.jsonl)") {
			t.Fatalf("waiting for a finding:\n%s", out)
		}
		if len(d.ledger()) == 1 {
			d.must(0, strings.Replace(command(t, out, "it ran"), "TEXT", "'the ledger holds refund "+call+"'", 1))
		} else {
			d.must(0, command(t, out, "it did not run"))
		}
	}
	t.Fatal("the run did not finish")
	return ""
}

// TestACrashAfterTheApprovalNeverRefundsTwice: once the refund is
// approved, the program crashes at each of its durable writes in turn
// (-crash-after N, exit 3) and is run again: the refund is made once, or,
// where the crash left it in doubt, the run waits for an operator, who
// finds it in the ledger and says so; never twice.
func TestACrashAfterTheApprovalNeverRefundsTwice(t *testing.T) {
	// After the approval the run writes the refund's intent, then its
	// outcome with the next model call's intent, then the answer.
	for crash := range 3 {
		t.Run(fmt.Sprint("crash after ", crash, " writes"), func(t *testing.T) {
			d := newDesk(t)
			first, call := waitsForApproval(t, d)
			d.must(0, command(t, first, "approve"))
			if out := d.must(3, fmt.Sprint("refund -crash-after ", crash)); !strings.Contains(out, "crashed on purpose") {
				t.Fatalf("the crash:\n%s", out)
			}
			if n := len(d.ledger()); n != min(crash, 1) {
				t.Fatalf("%d refunds made by the crashed run", n)
			}
			out := settle(t, d, call)
			answer := "refund-1: agent_finished after 3 steps: Dear Dana, I refunded 250.00 EUR for order A-1042 (provider reference " + call + ").\n"
			if crash == 1 { // the refund made, its outcome lost: the model is told what the operator found
				answer = "refund-1: agent_finished after 3 steps: Dear Dana, the ledger holds refund " + call + ".\n"
			}
			steps := refundSteps("executed")
			if crash == 2 { // the refund's step was durable, and printed, before the crash
				_, steps, _ = strings.Cut(steps, "\n")
			}
			if answer = steps + answer; out != answer || len(d.ledger()) != 1 {
				t.Fatalf("the end:\n%s\nwant\n%s\nledger %+v", out, answer, d.ledger())
			}
		})
	}
}

// TestAKilledRefundIsNeverMadeTwice: the process is killed (SIGKILL)
// while the provider confirms the approved refund it made: run again, the
// program makes no second refund — the run waits for an operator, listed
// awaiting_resolution — and once the operator says it was made, it
// finishes.
func TestAKilledRefundIsNeverMadeTwice(t *testing.T) {
	d := newDesk(t)
	first, call := waitsForApproval(t, d)
	d.must(0, command(t, first, "approve"))
	cmd := exec.Command(filepath.Join(binaries(t), "refund"), "-provider-delay", "1m")
	cmd.Dir, cmd.Env = d.dir, d.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(d.ledger()) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the refund was not made")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	out := d.must(0, "refund")
	if !strings.HasPrefix(out, "refund-1 waits for an operator: a crash left refund {\"amount\":250,\"order\":\"A-1042\"} (step 1, call "+call+") in doubt since ") {
		t.Fatalf("after the kill:\n%s", out)
	}
	if listed := d.must(0, "polyloop-inspect runs --status awaiting_resolution refund.db"); !strings.Contains(listed, "refund call "+call) {
		t.Fatalf("runs --status awaiting_resolution:\n%s", listed)
	}
	if end := settle(t, d, call); !strings.Contains(end, "agent_finished") || len(d.ledger()) != 1 {
		t.Fatalf("the end:\n%s\nledger %+v", end, d.ledger())
	}
}

// forkedLog is run's log in the store file path: its RunStarted's fork
// origin and its steps.
func forkedLog(t *testing.T, path, run string) (*events.ForkOrigin, []events.StepRecord) {
	t.Helper()
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), run)
	if err != nil || len(stream) == 0 {
		t.Fatalf("run %s: %d events, %v", run, len(stream), err)
	}
	return stream[0].Event.(events.RunStarted).Fork, projections.Fold(stream).Trajectory()
}

// TestAForkUnderAHigherLimitRefundsWithoutWaiting: refund-1 waits for
// approval of 250 at step 1; forked at step 1 onto refund-2 with
// -approve-over 300, the fork keeps refund-1's lookup (step 0) as it is,
// records refund-1, step 1 and the policy's difference, and refunds 250
// without waiting, once, as refund-2's. A step beyond refund-1's end, a
// taken run id, an unknown source and -at without -fork-from are refused,
// exit 1, writing nothing.
func TestAForkUnderAHigherLimitRefundsWithoutWaiting(t *testing.T) {
	d := newDesk(t)
	waitsForApproval(t, d)
	out := d.must(0, "refund -run refund-2 -fork-from refund-1 -at 1 -approve-over 300")
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(strings.ReplaceAll(refundSteps("executed"), "refund-1", "refund-2")) + `refund-2 forked from refund-1 at step 1\nrefund-2: agent_finished after 3 steps: Dear Dana, I refunded 250.00 EUR for order A-1042 \(provider reference [0-9A-Z]{26}\)\.\n$`).MatchString(out) {
		t.Fatalf("the fork:\n%s", out)
	}
	if got := d.ledger(); len(got) != 1 || got[0].Run != "refund-2" || got[0].Amount != 250 {
		t.Fatalf("the ledger: %+v, want refund-2's one refund of 250", got)
	}
	store := filepath.Join(d.dir, "refund.db")
	origin, steps := forkedLog(t, store, "refund-2")
	_, source := forkedLog(t, store, "refund-1")
	if origin == nil || origin.Run != "refund-1" || origin.Step != 1 || !slices.Contains(origin.Differences, `approval.refunds_over: "100" at start, now "300"`) {
		t.Fatalf("the fork's RunStarted.Fork is %+v, want refund-1 at step 1, the approval limit's difference", origin)
	}
	if len(source) != 1 || !reflect.DeepEqual(steps[:1], source) {
		t.Fatalf("the fork's first step\n%+v\ndiffers from its source's\n%+v", steps[:1], source)
	}
	for _, tc := range []struct{ line, want string }{
		{"refund -run refund-3 -fork-from refund-1 -at 2", `run "refund-1" has no step 2 to fork at`},
		{"refund -run refund-2 -fork-from refund-1 -at 1", `run "refund-2" exists in ` + store + `: a fork needs a new run id (-run NAME)`},
		{"refund -run refund-3 -fork-from nosuch -at 0", `no run "nosuch" to fork in ` + store},
		{"refund -run refund-3 -at 1", "-at 1: a step to fork at needs -fork-from RUN"},
		{"refund -run refund-3 -fork-from refund-1 -at 1 -crash-after 2", "-fork-from with -crash-after: the crashing store does not fork runs"},
	} {
		if out := d.must(1, tc.line); !strings.Contains(out, tc.want) {
			t.Errorf("$ %s\n%swant %q", tc.line, out, tc.want)
		}
	}
	if listed := d.must(0, "polyloop-inspect runs refund.db"); strings.Contains(listed, "refund-3") || strings.Contains(listed, "nosuch") {
		t.Fatalf("a refused fork wrote a run:\n%s", listed)
	}
}
