// Command slowagent is the process tests' agent: it opens a bbolt store
// read-write, as an agent does (its reader socket on), and appends a sound
// run's events one at a time, a delay apart, saying on standard output
// "opened" and then "appended N" after each durable append, holding the
// run (LockRun) as the engine does while it drives one; with -hold N
// it stops after N events and waits to be killed, or with -gate FILE
// until FILE exists, then goes on.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
)

func main() {
	path := flag.String("store", "", "store file")
	runID := flag.String("run", "live", "run id")
	delay := flag.Duration("delay", 100*time.Millisecond, "wait before each append")
	hold := flag.Int("hold", -1, "stop after this many events and wait to be killed")
	gate := flag.String("gate", "", "with -hold: go on once this file exists")
	flag.Parse()
	s, err := kv.Open(*path, kv.Options{LockTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "slowagent:", err)
		os.Exit(1)
	}
	// As the engine does: the run is this process's while it drives it.
	release, err := s.LockRun(*runID)
	if err != nil {
		fmt.Fprintln(os.Stderr, "slowagent:", err)
		os.Exit(1)
	}
	defer release()
	fmt.Println("opened")
	var tail ulid.ULID
	for i, ev := range proptest.SoundStream(*runID) {
		if i == *hold {
			for *gate == "" {
				select {}
			}
			for _, err := os.Stat(*gate); err != nil; _, err = os.Stat(*gate) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		time.Sleep(*delay)
		envs, err := s.Append(context.Background(), *runID, tail, ev)
		if err != nil {
			fmt.Fprintln(os.Stderr, "slowagent:", err)
			os.Exit(1)
		}
		tail = envs[0].ID
		fmt.Println("appended", i+1)
	}
	release()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "slowagent:", err)
		os.Exit(1)
	}
}
