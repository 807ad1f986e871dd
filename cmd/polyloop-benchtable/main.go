// Command polyloop-benchtable reads `go test -bench` output (any -count) on
// standard input and prints PolyLoop's benchmark table: for every pair of
// benchmarks named <name>/floor and <name>/polyloop, the median ns/op of
// each over the repeated runs and their ratio, beside the target where one
// is set; for the concurrent-runs families (bbolt, PostgreSQL and its raw
// floor), each run count's throughput relative to runs=1. Medians and ratios, never a single absolute time: the machines
// are shared and noisy.
//
//	go test -run '^$' -bench . -count 5 ./kv ./engine | polyloop-benchtable
//	polyloop-benchtable --version
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/polyloop/polyloop/cmd/internal/buildinfo"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// targets are the goals of the performance issue, by pair name.
var targets = map[string]string{
	"BenchmarkStepLatency":                             "≤ 1.15",
	"BenchmarkStepCPU":                                 "≤ 3",
	"BenchmarkResume/steps=10000":                      "≤ 2",
	"BenchmarkConcurrentRuns/runs=64":                  "≥ 12",
	"BenchmarkConcurrentRuns/runs=1":                   "(base)",
	"BenchmarkConcurrentTextRuns/runs=64":              "≥ 12",
	"BenchmarkConcurrentTextRuns/runs=1":               "(base)",
	"BenchmarkConcurrentAppend/goroutines=1":           "",
	"BenchmarkPostgresStepLatency":                     "≤ 1.3",
	"BenchmarkPostgresConcurrentRuns/runs=64/polyloop": "≥ 10",
	"BenchmarkPostgresConcurrentRuns/runs=1/polyloop":  "(base)",
	"BenchmarkPostgresConcurrentRuns/runs=64/floor":    "(the server's own)",
	"BenchmarkPostgresConcurrentRuns/runs=1/floor":     "(base)",
}

// sample is one benchmark's repeated results.
type sample struct {
	nsPerOp []float64
	metrics map[string][]float64 // unit -> values
}

var lineRE = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(.*)$`)

func parse(r io.Reader) (map[string]*sample, []string) {
	samples := map[string]*sample{}
	var order []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		name := m[1]
		s := samples[name]
		if s == nil {
			s = &sample{metrics: map[string][]float64{}}
			samples[name] = s
			order = append(order, name)
		}
		ns, _ := strconv.ParseFloat(m[2], 64)
		s.nsPerOp = append(s.nsPerOp, ns)
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				s.metrics[f[i+1]] = append(s.metrics[f[i+1]], v)
			}
		}
	}
	return samples, order
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func extras(s *sample) string {
	var units []string
	for u := range s.metrics {
		units = append(units, u)
	}
	sort.Strings(units)
	var out []string
	for _, u := range units {
		out = append(out, fmt.Sprintf("%.4g %s", median(s.metrics[u]), u))
	}
	return strings.Join(out, ", ")
}

func write(w io.Writer, samples map[string]*sample, order []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BENCHMARK\tFLOOR ns/op\tPOLYLOOP ns/op\tRATIO\tTARGET\tRUNS\tPOLYLOOP METRICS")
	seen := map[string]bool{}
	for _, name := range order {
		base, ok := strings.CutSuffix(name, "/polyloop")
		if !ok || seen[base] {
			continue
		}
		seen[base] = true
		p, f := samples[name], samples[base+"/floor"]
		if f == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f×\t%s\t%d\t%s\n", base, median(f.nsPerOp), median(p.nsPerOp),
			median(p.nsPerOp)/median(f.nsPerOp), targets[base], len(p.nsPerOp), extras(p))
	}
	tw.Flush()

	single(w, samples, order)
	scaling(w, samples, order, "BenchmarkConcurrentRuns/", "", "CONCURRENT RUNS (bbolt)")
	scaling(w, samples, order, "BenchmarkConcurrentTextRuns/", "", "CONCURRENT RUNS, 2 KB REPLY + 4 KB OBSERVATION (bbolt)")
	relative(w, samples, order, "BenchmarkTextAppend/", "g=1", "THE STORE ALONE, ISSUE 16's STEP (kv)")
	relative(w, samples, order, "BenchmarkLayoutFloor/", "layout=one-run", "BBOLT FLOOR BY LAYOUT, PERFECT GROUPING")
	scaling(w, samples, order, "BenchmarkPostgresConcurrentRuns/", "/polyloop", "CONCURRENT RUNS (PostgreSQL)")
	scaling(w, samples, order, "BenchmarkPostgresConcurrentRuns/", "/floor", "CONCURRENT RAW pgx TRANSACTIONS (the floor)")
}

// singles are benchmarks measured against a target, not a floor: their
// metrics are the figures (storage per step, peak memory).
var singles = map[string]string{
	"BenchmarkStorageBytes": "payload-x ≤ 1.3",
	"BenchmarkPeakRSS":      "proportional to the history",
}

// single prints the medians of the singles' metrics.
func single(w io.Writer, samples map[string]*sample, order []string) {
	var rows []string
	for _, name := range order {
		if target, ok := singles[name]; ok {
			rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%d", name, extras(samples[name]), target, len(samples[name].nsPerOp)))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASURE\tMEDIANS\tTARGET\tRUNS")
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	tw.Flush()
}

// scaling prints a family's throughput relative to its runs=1 member: the
// benchmarks named prefix+"runs=N"+suffix.
func scaling(w io.Writer, samples map[string]*sample, order []string, prefix, suffix, title string) {
	one := samples[prefix+"runs=1"+suffix]
	if one == nil {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tns/step\tTHROUGHPUT vs runs=1\tTARGET\tRUNS\tMETRICS\n", title)
	for _, name := range order {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || !strings.HasSuffix(rest, suffix) || strings.Contains(strings.TrimSuffix(rest, suffix), "/") {
			continue
		}
		s := samples[name]
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f×\t%s\t%d\t%s\n", strings.TrimSuffix(rest, suffix),
			median(s.nsPerOp), median(one.nsPerOp)/median(s.nsPerOp), targets[name], len(s.nsPerOp), extras(s))
	}
	tw.Flush()
}

// relative prints every benchmark named prefix+something relative to
// prefix+base: throughput (base ns/op ÷ its ns/op).
func relative(w io.Writer, samples map[string]*sample, order []string, prefix, base, title string) {
	one := samples[prefix+base]
	if one == nil {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tns/step\tTHROUGHPUT vs %s\tRUNS\n", title, base)
	for _, name := range order {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			s := samples[name]
			fmt.Fprintf(tw, "%s\t%.0f\t%.2f×\t%d\n", rest, median(s.nsPerOp), median(one.nsPerOp)/median(s.nsPerOp), len(s.nsPerOp))
		}
	}
	tw.Flush()
}

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(buildinfo.Line("polyloop-benchtable"))
		return
	}
	samples, order := parse(os.Stdin)
	if len(samples) == 0 {
		fmt.Fprintln(os.Stderr, "polyloop-benchtable: no benchmark lines on standard input")
		os.Exit(1)
	}
	write(os.Stdout, samples, order)
}
