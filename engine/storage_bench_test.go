package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// The storage benchmark's steps: a 2 KB model reply and a 4 KB
// observation, as issue 16 measures them. Their text is real prose and
// code — windows of this repository's own documentation and Go source at
// varying offsets, a stand-in for LLM replies and tool output (no corpus of
// real model output is at hand here) — so compression is measured on text
// that compresses like text, not on noise or on a repeated phrase.
const (
	replyBytes = 2048
	obsBytes   = 4096
)

var vocabulary = strings.Fields(`the agent reads a file and then it writes the result into the log step
model action observation tool call returns error output function package import return value
config path directory list count words lines user goal plan next check test build run done`)

// corpus is the documentation and source the windows are cut from.
var corpus = func() string {
	var b strings.Builder
	for _, pattern := range []string{"../README.md", "../BENCHMARKS.md", "../*/doc.go", "../engine/*.go", "../kv/*.go"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil {
				b.Write(data)
			}
		}
	}
	return b.String()
}()

func text(rng *rand.Rand, n int) string {
	if len(corpus) < 4*n {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
			b.WriteByte(' ')
		}
		return b.String()[:n]
	}
	at := rng.IntN(len(corpus) - n)
	return corpus[at : at+n]
}

type textModel struct{ steps int }

func (m textModel) Call(_ context.Context, c seams.ModelCall) (events.ModelReply, error) {
	if c.CallIndex >= m.steps {
		return events.ModelReply{CallID: "c", Content: "FINAL: done"}, nil
	}
	rng := rand.New(rand.NewPCG(uint64(c.CallIndex), 1))
	return events.ModelReply{CallID: fmt.Sprint("call-", c.CallIndex), Content: "ACTION: " + text(rng, replyBytes-len("ACTION: "))}, nil
}
func (textModel) Parameters() map[string]string { return nil }

type textExecutor struct{}

func (textExecutor) Execute(_ context.Context, c seams.ActionCall) (events.ActionOutcome, error) {
	rng := rand.New(rand.NewPCG(uint64(c.StepIdx), 2))
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: text(rng, obsBytes)}, nil
}
func (textExecutor) Parameters() map[string]string { return nil }

// BenchmarkStorageBytes: the store's pages per step of 6,144 bytes of
// payload, up to the high-water mark (B/step, payload-x; target ≤ 1.3x),
// what the file system holds for the file (disk-B/step, its blocks), and
// the file's size per step (file-B/step: bbolt grows the file ahead of
// need, doubling, by truncate, so its size moves in steps and the part
// beyond the pages written holds no blocks). One op is a run of 500 steps.
func BenchmarkStorageBytes(b *testing.B) {
	const steps = 500
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "s.db")
		store, err := kv.Open(path, kv.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		req := engine.Request{RunID: "bytes", Executor: textExecutor{}, ModelReplayPolicy: events.ReplaySafe,
			Budget: engine.Budget{MaxSteps: steps + 1, MaxActions: steps + 1, MaxConsecutiveParseFailures: 1, MaxPromptChars: 1 << 30}}
		if _, err := engine.Run(context.Background(), engine.Definition{Model: textModel{steps: steps}, Parser: seamstest.Parser{}, Store: store}, req); err != nil {
			b.Fatal(err)
		}
		used, err := store.DataSize()
		store.Close()
		if err != nil {
			b.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(used)/steps, "B/step")
		b.ReportMetric(float64(used)/steps/(replyBytes+obsBytes), "payload-x")
		b.ReportMetric(float64(fi.Size())/steps, "file-B/step")
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			b.ReportMetric(float64(st.Blocks*512)/steps, "disk-B/step") // blocks held: written pages only
		}
	}
}
