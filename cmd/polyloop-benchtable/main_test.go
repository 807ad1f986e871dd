package main

import (
	"bytes"
	"strings"
	"testing"
)

const input = `goos: linux
BenchmarkStepLatency/floor-2      1000   1000000 ns/op
BenchmarkStepLatency/polyloop-2   1000   1100000 ns/op   2.000 txs/step
BenchmarkStepLatency/floor-2      1000   3000000 ns/op
BenchmarkStepLatency/polyloop-2   1000   1300000 ns/op   2.000 txs/step
BenchmarkStepLatency/floor-2      1000   1200000 ns/op
BenchmarkStepLatency/polyloop-2   1000   1200000 ns/op   2.002 txs/step
BenchmarkConcurrentRuns/runs=1-2   100   1200000 ns/op
BenchmarkConcurrentRuns/runs=64-2  100    100000 ns/op   0.07 txs/step
BenchmarkTextAppend/g=1-2          100    600000 ns/op
BenchmarkTextAppend/g=64-2         100     40000 ns/op
PASS
`

// TestTableUsesMediansAndRatios: medians over repeated runs (the 3 ms
// outlier does not move the floor), ratio polyloop/floor, throughput
// relative to runs=1 and to the store's lone appender (g=1).
func TestTableUsesMediansAndRatios(t *testing.T) {
	samples, order := parse(strings.NewReader(input))
	var out bytes.Buffer
	write(&out, samples, order)
	got := out.String()
	for _, want := range []string{"BenchmarkStepLatency  1200000  1200000  1.00×  ≤ 1.15  3  2 txs/step", "runs=64  100000  12.00×  ≥ 12", "g=64  40000  15.00×  1"} {
		if !strings.Contains(strings.Join(strings.Fields(got), "  "), strings.Join(strings.Fields(want), "  ")) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestSinglesPrintTheirMetrics: a benchmark measured against a target,
// not a floor, prints the medians of its metrics.
func TestSinglesPrintTheirMetrics(t *testing.T) {
	in := "BenchmarkStorageBytes-2  2  1 ns/op  8000 B/step  1.30 payload-x\nBenchmarkStorageBytes-2  2  1 ns/op  9000 B/step  1.50 payload-x\nBenchmarkStorageBytes-2  2  1 ns/op  8500 B/step  1.40 payload-x\n"
	samples, order := parse(strings.NewReader(in))
	var out bytes.Buffer
	write(&out, samples, order)
	if !strings.Contains(out.String(), "8500 B/step, 1.4 payload-x") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// TestLayoutsAreRelativeToOneRun: the layout floor's rows are throughput
// relative to one run's step, and the text-payload family scales against
// its own runs=1.
func TestLayoutsAreRelativeToOneRun(t *testing.T) {
	in := `BenchmarkLayoutFloor/layout=one-run-2  10  600000 ns/op
BenchmarkLayoutFloor/layout=one-log/runs=64-2  10  30000 ns/op
BenchmarkConcurrentTextRuns/runs=1-2  10  800000 ns/op
BenchmarkConcurrentTextRuns/runs=64-2  10  80000 ns/op
`
	samples, order := parse(strings.NewReader(in))
	var out bytes.Buffer
	write(&out, samples, order)
	got := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"layout=one-log/runs=64 30000 20.00× 1", "runs=64 80000 10.00× ≥ 12"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
