// Command polyloop-inspect dumps and verifies PolyLoop event stores without
// writing to them.
//
//	polyloop-inspect runs [--json] [filters] STORE          list runs, newest first
//	polyloop-inspect events [--json] [--follow] STORE RUN   every event of a run
//	polyloop-inspect steps [--json] STORE RUN               a run's trajectory
//	polyloop-inspect verify [--json] STORE [RUN]            can each run be resumed? what does it wait for?
//	polyloop-inspect export [--run RUN]... STORE            many runs' steps as JSON Lines
//	polyloop-inspect serve [--addr ADDR] STORE              the run viewer (read-only)
//	polyloop-inspect --version                              the module version and VCS revision it was built from
//
// STORE is a bbolt file or a PostgreSQL connection string (a postgres://
// URL or a key=value string), named in messages without its password
// (stores.Describe). "polyloop-inspect COMMAND
// --help" gives a command's details (cli.go holds the texts). A run
// awaiting a person's decision is shown with its pending call and the
// polyloop-admin commands that decide it (pending.go).
//
// Exit status: 0 when all is well; 1 when a run is corrupt, a run named is
// not in the store, or the store cannot be read; 2 for bad usage.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
