// Command polyloop-inspect dumps and verifies PolyLoop event stores without
// writing to them.
//
//	polyloop-inspect runs STORE                  list runs
//	polyloop-inspect events [--json] STORE RUN   every event of a run
//	polyloop-inspect steps [--json] STORE RUN    a run's trajectory
//	polyloop-inspect verify STORE [RUN]          can each run be resumed?
//
// STORE is a bbolt file or a postgres:// URL.
//
// Exit status: 0 when all is well, 1 when a run is corrupt or the store
// cannot be read, 2 for bad usage.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
